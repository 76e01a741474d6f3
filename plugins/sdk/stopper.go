package sdk

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"google.golang.org/grpc"
)

// stopReason says why an adapter process is stopping.
type stopReason string

const (
	stopNone     stopReason = ""
	stopLifeline stopReason = "lifeline closed"
	stopSignal   stopReason = "SIGTERM"
	stopRejected stopReason = "configuration rejected"
)

// stdioMethod is go-plugin's stdout/stderr relay stream. It never ends on
// its own, so a graceful stop has to end it first.
const stdioMethod = "/plugin.GRPCStdio/StreamStdio"

// gracefulStopTimeout bounds a graceful stop, after which the server is
// stopped hard. A graceful stop never finishes on its own while the host
// is connected: go-plugin's broker stream stays open until the client
// goes. What it buys is time for replies already written (the rejected
// Configure's) to reach the host before the connection closes.
const gracefulStopTimeout = time.Second

// stopper ends the plugin's gRPC server, which makes go-plugin's Serve
// return. Every way of stopping (lifeline, SIGTERM, a rejected
// configuration) goes through it; the first request wins.
type stopper struct {
	log    hclog.Logger
	cancel context.CancelFunc

	mu      sync.Mutex
	srv     *grpc.Server
	reason  stopReason
	code    int
	stdio   map[*stdioStream]struct{}
	stopped bool
}

func newStopper(log hclog.Logger, cancel context.CancelFunc) *stopper {
	return &stopper{log: log, cancel: cancel, stdio: map[*stdioStream]struct{}{}}
}

// An adapter reads fs::write chunks and marshals fs::read chunks: size
// gRPC's buffers for them.
func init() { contract.UseChunkBufferPool() }

// newServer is go-plugin's ServeConfig.GRPCServer: the contract's message
// limits, plus the interceptor that lets a graceful stop end the stdio
// relay.
func (s *stopper) newServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts, contract.GRPCServerOptions()...)
	opts = append(opts, contract.ChunkBufferPoolOption())
	opts = append(opts, grpc.ChainStreamInterceptor(s.interceptStream))
	srv := grpc.NewServer(opts...)
	s.mu.Lock()
	s.srv = srv
	reason, stopped := s.reason, s.stopped
	s.mu.Unlock()
	if stopped {
		// A stop came in while go-plugin was still setting up; grpc's
		// Serve returns at once on a stopped server.
		go s.halt(srv, reason == stopRejected)
	}
	return srv
}

// stop asks the plugin to stop with exit status code. A rejected
// configuration stops gracefully so the rejection reaches the host before
// the connection closes; every other reason stops at once, cancelling
// calls in flight (the adapter's Shutdown then cleans up).
func (s *stopper) stop(reason stopReason, code int) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped, s.reason, s.code = true, reason, code
	srv := s.srv
	s.mu.Unlock()
	s.cancel()
	if srv != nil {
		go s.halt(srv, reason == stopRejected)
	}
}

func (s *stopper) halt(srv *grpc.Server, graceful bool) {
	if !graceful {
		srv.Stop()
		return
	}
	s.mu.Lock()
	for st := range s.stdio {
		st.cancel()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(gracefulStopTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Debug("the host is still connected; closing the connection")
		srv.Stop()
		<-done
	}
}

// requested reports whether a stop has been asked for.
func (s *stopper) requested() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// outcome is the exit status and reason of the stop, if any was asked for.
func (s *stopper) outcome() (int, stopReason) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		return ExitOK, stopNone
	}
	return s.code, s.reason
}

// stdioStream is a server stream whose context a graceful stop can cancel.
type stdioStream struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelFunc
}

func (s *stdioStream) Context() context.Context { return s.ctx }

func (s *stopper) interceptStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != stdioMethod {
		return handler(srv, ss)
	}
	ctx, cancel := context.WithCancel(ss.Context())
	st := &stdioStream{ServerStream: ss, ctx: ctx, cancel: cancel}
	s.mu.Lock()
	if s.stopped && s.reason == stopRejected {
		cancel()
	}
	s.stdio[st] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.stdio, st)
		s.mu.Unlock()
		cancel()
	}()
	return handler(srv, st)
}
