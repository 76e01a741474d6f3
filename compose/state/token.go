package state

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ProjectTokenFile holds the project token: the secret Compose gives the
// engine it manages (III_ENGINE_TOKEN) and sends as `token` on
// engine::adapters::start, stop and restart (docs/project-token.md).
const ProjectTokenFile = "project-token"

// projectTokenBytes is the token's entropy; it is written hex-encoded.
const projectTokenBytes = 32

// ProjectTokenPath is the project token's file.
func (s *Store) ProjectTokenPath() string { return filepath.Join(s.dir, ProjectTokenFile) }

// ParseProjectToken reads the content of a project-token file: 64 lower-case
// hex digits and an optional final newline. Anything else is an error, and
// the caller writes a fresh token: a token Compose cannot read back is one
// it cannot send.
func ParseProjectToken(data []byte) (string, error) {
	t := bytes.TrimSuffix(data, []byte("\n"))
	if len(t) != 2*projectTokenBytes {
		return "", fmt.Errorf("a project token is %d hex digits, this holds %d bytes", 2*projectTokenBytes, len(t))
	}
	for _, c := range t {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", errors.New("a project token holds only the hex digits 0-9 and a-f")
		}
	}
	return string(t), nil
}

// ProjectToken returns the project token, making one the first time (and
// whenever the file cannot be read back as one). created says a new token
// was written.
func (s *Store) ProjectToken() (token string, created bool, err error) {
	data, err := os.ReadFile(s.ProjectTokenPath())
	switch {
	case err == nil:
		if t, perr := ParseProjectToken(data); perr == nil {
			// The token is a secret: keep its file owner-only even if
			// someone loosened it.
			_ = os.Chmod(s.ProjectTokenPath(), 0o600)
			return t, false, nil
		}
	case !errors.Is(err, os.ErrNotExist):
		return "", false, ioError("read "+s.ProjectTokenPath(), err)
	}
	t, err := s.ReplaceProjectToken()
	if err != nil {
		return "", false, err
	}
	return t, true, nil
}

// ReplaceProjectToken writes a new random project token (32 bytes from the
// OS's CSPRNG, hex-encoded, one line, mode 0600, atomically) and returns it.
func (s *Store) ReplaceProjectToken() (string, error) {
	var raw [projectTokenBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", ioError("make a project token", err)
	}
	t := hex.EncodeToString(raw[:])
	if err := writeAtomic(s.ProjectTokenPath(), []byte(t+"\n"), 0o600); err != nil {
		return "", ioError("write "+s.ProjectTokenPath(), err)
	}
	return t, nil
}
