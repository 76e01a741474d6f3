// Package workermanager runs the iii-worker-manager listeners: one HTTP
// server per config.yaml instance, each serving the engine's handler (the
// worker WebSocket and the channel endpoints). Reloads start, stop and
// rebind instances one by one, so workers connected through an unchanged
// listener are never disturbed.
package workermanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/host/engine"
)

// CodeListenFailed: a listener could not bind its host:port.
const CodeListenFailed = "LISTEN_FAILED"

// Error is a listener failure a user must fix.
type Error struct {
	Code    string
	Message string
	Err     error
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }
func (e *Error) Unwrap() error { return e.Err }

// Handlers makes the HTTP handler of one listener from its policy: the
// engine's HandlerFor.
type Handlers interface {
	HandlerFor(engine.ListenerPolicy) http.Handler
}

// Manager owns the listeners.
type Manager struct {
	handlers Handlers
	log      hclog.Logger

	mu        sync.Mutex
	listeners map[string]*listener
}

type listener struct {
	cfg  config.Listener
	srv  *http.Server
	addr string // the bound address (the real port when cfg.Port is 0)
	done chan struct{}
}

// New returns a manager serving, on every listener it starts, the handler
// h makes for that listener's policy.
func New(h Handlers, log hclog.Logger) *Manager {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Manager{handlers: h, log: log, listeners: map[string]*listener{}}
}

// Policy is what a listener asks of its connections: its RBAC block and
// middleware, the Host check when it is bound to loopback, and a token from
// every connection when it is not and has no auth function (anyone who can
// reach the address could otherwise call every function that is not
// privileged).
func Policy(l config.Listener) engine.ListenerPolicy {
	p := engine.ListenerPolicy{
		Name:                 l.Name,
		RBAC:                 l.RBACConfig(),
		MiddlewareFunctionID: l.MiddlewareFunctionID,
		LoopbackHostOnly:     l.Loopback(),
		Limits: engine.Limits{
			FrameBytes:                     l.Limits.FrameBytes,
			Connections:                    l.Limits.Connections,
			RegistrationsPerConnection:     l.Limits.RegistrationsPerConnection,
			QueuedBytesPerConnection:       l.Limits.QueuedBytesPerConnection,
			IDBytes:                        l.Limits.IDBytes,
			InflightPerConnection:          l.Limits.InflightPerConnection,
			InflightBytesPerConnection:     l.Limits.InflightBytesPerConnection,
			RegistrationBytes:              l.Limits.RegistrationBytes,
			RegistrationBytesPerConnection: l.Limits.RegistrationBytesPerConnection,
		},
	}
	p.RequireToken = !p.LoopbackHostOnly && (p.RBAC == nil || p.RBAC.AuthFunctionID == "")
	return p
}

// Start binds and serves one listener. A listener of the same name must
// not be running.
func (m *Manager) Start(ctx context.Context, l config.Listener) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.startLocked(ctx, l)
}

func (m *Manager) startLocked(ctx context.Context, l config.Listener) error {
	if _, ok := m.listeners[l.Name]; ok {
		return fmt.Errorf("listener %s is already running", l.Name)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", l.Addr())
	if err != nil {
		return &Error{Code: CodeListenFailed, Err: err, Message: fmt.Sprintf(
			"%s cannot listen on %s: %v; stop whatever holds that address or give %s another port in config.yaml",
			l.Name, l.Addr(), causeOf(err), l.Name)}
	}
	policy := Policy(l)
	srv := &http.Server{
		Handler: m.handlers.HandlerFor(policy),
		// The WebSocket upgrade must complete within the handshake time;
		// once upgraded the connection is the engine's and no HTTP
		// timeout applies.
		ReadHeaderTimeout: l.HandshakeTimeout,
		ErrorLog:          m.log.Named(l.Name).StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
	}
	li := &listener{cfg: l, srv: srv, addr: ln.Addr().String(), done: make(chan struct{})}
	m.listeners[l.Name] = li
	go func() {
		defer close(li.done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("listener stopped", "listener", l.Name, "addr", li.addr, "error", err)
		}
	}()
	switch {
	case policy.LoopbackHostOnly:
		m.log.Info("listening for workers", "listener", l.Name, "addr", "ws://"+li.addr, "access", "loopback only; Host must be 127.0.0.1, localhost or [::1]")
	case policy.RequireToken:
		m.log.Warn("listening for workers beyond loopback", "listener", l.Name, "addr", "ws://"+li.addr,
			"access", "every connection must present the engine token or a credential it issued (no rbac.auth_function_id on this listener)")
	default:
		m.log.Warn("listening for workers beyond loopback", "listener", l.Name, "addr", "ws://"+li.addr,
			"access", "connections are authenticated by "+policy.RBAC.AuthFunctionID)
	}
	return nil
}

// causeOf strips net.OpError's "listen tcp 127.0.0.1:1:" prefix, which the
// message already says.
func causeOf(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// Stop closes one listener. Connections already upgraded to WebSocket
// stay: they belong to the engine, which keeps serving them.
func (m *Manager) Stop(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopLocked(ctx, name)
}

func (m *Manager) stopLocked(ctx context.Context, name string) error {
	li, ok := m.listeners[name]
	if !ok {
		return nil
	}
	delete(m.listeners, name)
	err := li.srv.Shutdown(ctx)
	if err != nil {
		// The deadline passed with requests still in flight.
		_ = li.srv.Close()
	}
	<-li.done
	m.log.Info("listener closed", "listener", name, "addr", li.addr)
	return err
}

// Rebind moves a running listener to new settings: the old address is
// released first (the new one may be the same port on another host).
func (m *Manager) Rebind(ctx context.Context, l config.Listener) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.stopLocked(ctx, l.Name); err != nil {
		return err
	}
	return m.startLocked(ctx, l)
}

// Apply makes the running listeners match ls: it stops those no longer
// declared, rebinds those whose settings changed and starts new ones;
// unchanged listeners are left alone. Stops run first so a port can move
// from one instance to another.
func (m *Manager) Apply(ctx context.Context, ls []config.Listener) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	want := map[string]config.Listener{}
	for _, l := range ls {
		want[l.Name] = l
	}
	var stop []string
	for name, li := range m.listeners {
		if l, ok := want[name]; !ok || l != li.cfg {
			stop = append(stop, name)
		}
	}
	sort.Strings(stop)
	var errs []error
	for _, name := range stop {
		errs = append(errs, m.stopLocked(ctx, name))
	}
	for _, l := range ls {
		if _, running := m.listeners[l.Name]; running {
			continue
		}
		if err := m.startLocked(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Addrs maps each running listener to the address it is bound to.
func (m *Manager) Addrs() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]string, len(m.listeners))
	for name, li := range m.listeners {
		out[name] = li.addr
	}
	return out
}

// Close stops every listener.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.listeners))
	for name := range m.listeners {
		names = append(names, name)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		errs = append(errs, m.stopLocked(ctx, name))
	}
	return errors.Join(errs...)
}
