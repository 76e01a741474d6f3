package server

import "github.com/iii-sandbox/iii/host/pluginhost"

// engineToken is the engine token in force: III_ENGINE_TOKEN from the
// engine's environment when set and not empty, else config.yaml's
// engine_token (as last loaded), else none. docs/project-token.md.
func (s *Server) engineToken() string {
	if v, ok := s.lookup(pluginhost.EnvEngineToken); ok && v != "" {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg == nil {
		return ""
	}
	return s.cfg.EngineToken
}

// workerLookup is the environment as workers may see it through the
// configuration worker, which expands ${VAR} in stored values at read
// time: any worker that can store "${III_ENGINE_TOKEN}" could otherwise
// read the token back. The variable reads as unset there.
func (s *Server) workerLookup(name string) (string, bool) {
	if name == pluginhost.EnvEngineToken {
		return "", false
	}
	return s.lookup(name)
}
