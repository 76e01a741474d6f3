package server

import (
	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/host/httpfn"
)

// syncHTTPFunctions brings the iii-http-functions worker in step with the
// file: started with its security: block, given a new one when the block
// changed, stopped when the entry is gone (the engine then drops every
// HTTP-invocation function, and refuses new ones, as upstream does
// without the worker). prev is the entry in force before; nil at start.
func (s *Server) syncHTTPFunctions(prev, next *config.HTTPFunctions) {
	if sameHTTPFunctions(prev, next) && (next == nil) == (s.eng.HTTPFunctions() == nil) {
		return
	}
	if next == nil {
		s.eng.SetHTTPFunctions(nil)
		s.log.Info("iii-http-functions stopped; HTTP-invocation functions are dropped and new ones refused")
		return
	}
	sec := next.Security()
	inv, err := httpfn.New(httpfn.Options{Security: sec, LookupEnv: s.lookup})
	if err != nil {
		// config.Parse has checked the patterns already.
		s.log.Error("iii-http-functions cannot start; HTTP-invocation functions are refused", "worker", next.Name, "error", err)
		s.eng.SetHTTPFunctions(nil)
		return
	}
	s.eng.SetHTTPFunctions(httpfn.EngineHook{Invoker: inv})
	s.log.Info("iii-http-functions running", "worker", next.Name, "url_allowlist", sec.URLAllowlist,
		"block_private_ips", sec.BlockPrivateIPs, "require_https", sec.RequireHTTPS)
}

// stopHTTPFunctions drops the invoker's idle connections when the engine
// stops.
func (s *Server) stopHTTPFunctions() {
	if s.eng != nil && s.eng.HTTPFunctions() != nil {
		s.eng.SetHTTPFunctions(nil)
	}
}

func sameHTTPFunctions(a, b *config.HTTPFunctions) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
