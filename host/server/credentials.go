package server

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/enginetoken"
)

// EnvCredentialsFile names the engine's credentials file in place of
// ~/.iii/engine-credentials.json (docs/security.md, "Persisted
// credentials").
const EnvCredentialsFile = "III_ENGINE_CREDENTIALS_FILE"

// credentialsFile is where the engine keeps the credentials issued with
// persist: true: $III_ENGINE_CREDENTIALS_FILE, else
// ~/.iii/engine-credentials.json beside the engine token; "" when there is
// no home directory (persisting is then refused).
func (s *Server) credentialsFile() string {
	if v, ok := s.lookup(EnvCredentialsFile); ok && v != "" {
		return v
	}
	home, err := s.home()
	if err != nil {
		s.log.Warn("no home directory: credentials issued with persist: true are refused", "error", err)
		return ""
	}
	return filepath.Join(home, enginetoken.Dir, engine.CredentialsFileName)
}

// home is the home directory under which ~/.iii lies: HOME from
// Options.LookupEnv when one is given, else os.UserHomeDir.
func (s *Server) home() (string, error) {
	if s.opts.LookupEnv == nil {
		return os.UserHomeDir()
	}
	if h, ok := s.opts.LookupEnv("HOME"); ok && h != "" {
		return h, nil
	}
	return "", errors.New("$HOME is not defined in the engine's environment")
}

// loadCredentials points the engine at its credentials file and loads the
// persisted credentials, before any listener accepts a connection. A file
// the engine refuses is logged by the engine and ignored.
func (s *Server) loadCredentials() {
	if p := s.credentialsFile(); p != "" {
		_, _ = s.eng.UseCredentialsFile(p)
	}
}
