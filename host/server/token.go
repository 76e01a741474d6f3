package server

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/internal/enginetoken"
)

// CodeEngineTokenUnusable: the engine has no token from III_ENGINE_TOKEN or
// engine_token, and the token file (~/.iii/engine-token) cannot be made or
// is refused (another user owns it, others may read it). The engine does
// not start without a token. docs/security.md.
const CodeEngineTokenUnusable = "ENGINE_TOKEN_UNUSABLE"

// engineToken is the engine token in force: III_ENGINE_TOKEN from the
// engine's environment when set and not empty, else config.yaml's
// engine_token (as last loaded), else the token in ~/.iii/engine-token.
// There is always one: a connection that presents it is admin (it may call
// privileged functions), and the plugin host checks engine::adapters::*
// against it. docs/security.md, docs/project-token.md.
func (s *Server) engineToken() string {
	if v, ok := s.lookup(pluginhost.EnvEngineToken); ok && v != "" {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg != nil && s.cfg.EngineToken != "" {
		return s.cfg.EngineToken
	}
	return s.fileToken
}

// ensureTokenFile reads the token file, making it on the first start, when
// neither the environment nor cfg sets a token (at start, and on a reload
// that drops engine_token). The file is read once; rotating it means
// deleting it and restarting the engine.
func (s *Server) ensureTokenFile(cfg *config.Config) error {
	if v, ok := s.lookup(pluginhost.EnvEngineToken); ok && v != "" {
		return nil
	}
	if cfg.EngineToken != "" {
		return nil
	}
	s.mu.Lock()
	have := s.fileToken != ""
	s.mu.Unlock()
	if have {
		return nil
	}
	home, err := s.home()
	if err != nil {
		return tokenError(fmt.Errorf("cannot find the home directory for ~/%s/%s: %w", enginetoken.Dir, enginetoken.FileName, err))
	}
	path := filepath.Join(home, enginetoken.Dir, enginetoken.FileName)
	tok, created, err := enginetoken.Ensure(path)
	if err != nil {
		return tokenError(err)
	}
	if created {
		s.log.Info("made the engine token; the same user's iii call and iii compose read it from there", "file", path)
	} else {
		s.log.Info("engine token from its file", "file", path)
	}
	s.mu.Lock()
	s.fileToken = tok
	s.mu.Unlock()
	return nil
}

func tokenError(err error) error {
	return errors.New(CodeEngineTokenUnusable + ": " + fmt.Sprint(err) +
		"; the engine needs a token: fix the file, or set " + pluginhost.EnvEngineToken + " or engine_token in config.yaml (docs/security.md)")
}

// workerLookup is the environment as workers may see it through the
// configuration worker, which expands ${VAR} in stored values at read
// time (for callers holding the engine token only): the token itself
// reads as unset there, so that not even a value stored as
// "${III_ENGINE_TOKEN}" ever prints it.
func (s *Server) workerLookup(name string) (string, bool) {
	if name == pluginhost.EnvEngineToken {
		return "", false
	}
	return s.lookup(name)
}
