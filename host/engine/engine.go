// Package engine is the iii engine: it accepts workers over WebSocket, keeps
// the function registry with its namespace leases, routes invocations between
// workers (and in-process workers), relays trigger registrations to their
// providers, relays streaming channels, and serves the engine::* builtins.
//
// The wire protocol is spec/engine-internals.md §1; the published SDKs work
// against this engine unchanged.
package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/internal/taskgroup"
	"github.com/iii-sandbox/iii/protocol"
)

// Defaults of Options.
const (
	DefaultNamespaceGrace       = 5 * time.Second
	DefaultChannelTTL           = 5 * time.Minute
	DefaultChannelSweepInterval = 60 * time.Second

	// reattachEvictTimeout bounds how long a reattaching connection waits for
	// the connection it evicts to finish its cleanup, so a stuck teardown
	// cannot wedge the new connection.
	reattachEvictTimeout = 5 * time.Second

	// readLimit is the largest frame the engine's own test clients accept;
	// what the engine accepts is Limits.FrameBytes.
	readLimit = DefaultFrameBytes

	// outQueueSize bounds each connection's outbound queue; a full queue
	// applies back-pressure to whoever is sending to that connection.
	outQueueSize = 1024

	// slowConsumerTimeout is how long a sender waits on a full outbound queue
	// before the receiving connection is declared stuck and dropped: one
	// worker that stops reading must not stall the rest of the engine.
	slowConsumerTimeout = 30 * time.Second

	builtinWorkerName = "iii-engine-functions"
)

// ErrClosed is returned by calls made after Close.
var ErrClosed = errors.New("engine closed")

// Options configure an Engine. The zero value is usable.
type Options struct {
	Logger               hclog.Logger  // nil = null logger
	Version              string        // engine version reported by builtins
	NamespaceGrace       time.Duration // registration_namespace_grace_ms; 0 = 5 s
	ChannelTTL           time.Duration // 0 = 5 min; channels not fully taken after this are swept
	ChannelSweepInterval time.Duration // 0 = 60 s (tests set it small)
	// AdminToken returns the engine token in force; a connection that
	// presents it ("Authorization: Bearer <token>") may call privileged
	// functions. nil or "" means no connection can (in-process callers
	// always can).
	AdminToken func() string
}

// Engine routes function calls between workers. It is safe for concurrent
// use. Create it with New and stop it with Close.
type Engine struct {
	opts Options
	log  hclog.Logger

	ctx    context.Context // ends at Close; parent of every worker context
	cancel context.CancelFunc
	closed atomic.Bool
	tasks  taskgroup.Group

	seed maphash.Seed

	// workers holds every live worker, socket and in-process, by id.
	workersMu sync.RWMutex
	workers   map[string]*worker

	// names is the worker-name lease table: one live holder per
	// (namespace, name).
	namesMu sync.Mutex
	names   map[nameKey]*worker

	reg      registry
	pending  pendingTable
	triggers triggerRegistry
	channels channelTable

	builtins *LocalWorker
	creds    credentialTable
	// guardSlot holds the registration guard (guard.go).
	guardSlot guardSlot
	inbound   inboundBudget

	heartbeat hostHeartbeat
	// enqueues bounds the enqueue hand-overs in flight (enqueue.go).
	enqueues chan struct{}
	// enqueued remembers who enqueued which target, to check the queue
	// provider's deliveries as them (authority.go).
	enqueued delegations

	// httpFns is the iii-http-functions worker (httpinvoke.go).
	httpFns httpFunctions

	// slowConsumer is slowConsumerTimeout; tests shorten it.
	slowConsumer time.Duration
}

// New returns a running engine. Serve Handler() to accept workers; Close
// stops it.
func New(opts Options) *Engine {
	return newEngine(opts, slowConsumerTimeout)
}

// newEngine is New with the slow-consumer timeout as a parameter, so tests
// can exercise it without waiting half a minute.
func newEngine(opts Options, slowConsumer time.Duration) *Engine {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.NamespaceGrace <= 0 {
		opts.NamespaceGrace = DefaultNamespaceGrace
	}
	if opts.ChannelTTL <= 0 {
		opts.ChannelTTL = DefaultChannelTTL
	}
	if opts.ChannelSweepInterval <= 0 {
		opts.ChannelSweepInterval = DefaultChannelSweepInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		opts:    opts,
		log:     opts.Logger,
		ctx:     ctx,
		cancel:  cancel,
		seed:    maphash.MakeSeed(),
		workers: make(map[string]*worker),
		names:   make(map[nameKey]*worker),

		slowConsumer: slowConsumer,
		enqueues:     make(chan struct{}, maxEnqueuesInFlight),
	}
	e.inbound = newInboundBudget()
	e.reg.init()
	e.pending.init(e.seed)
	e.triggers.init()
	e.channels.init()

	b, err := e.AttachLocalWorker(LocalWorkerSpec{
		Name:        builtinWorkerName,
		Namespace:   DefaultNamespace,
		Description: "Engine builtins: introspection, worker registration, channels.",
		Runtime:     "engine",
		Version:     opts.Version,
		PID:         os.Getpid(),
		Isolation:   "in-process",
		Internal:    true,
	})
	if err != nil {
		// A fresh engine holds no leases, so this cannot happen; log rather
		// than crash the host if it ever does.
		e.log.Error("attach engine builtins", "error", err)
	} else {
		e.builtins = b
		e.registerBuiltins(b)
	}

	for _, loop := range []func(){e.sweepChannels, e.watchWriters} {
		e.tasks.Go(loop)
	}
	return e
}

// Handler is HandlerFor a loopback listener with no RBAC and no middleware.
func (e *Engine) Handler() http.Handler {
	return e.HandlerFor(ListenerPolicy{Name: "iii-worker-manager", LoopbackHostOnly: true})
}

// HandlerFor serves one listener: GET / (the worker socket),
// GET /ws/channels/{id}?key=&dir=read|write (streaming channels) and
// GET /otel (the SDKs' telemetry socket, accepted and discarded), each
// behind the listener's Host check.
func (e *Engine) HandlerFor(policy ListenerPolicy) http.Handler {
	ls := &listenerState{policy: policy, limits: policy.Limits.withDefaults()}
	p := &ls.policy
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(rw http.ResponseWriter, r *http.Request) { e.serveWorker(rw, r, ls) })
	mux.HandleFunc("GET /ws/channels/{id}", func(rw http.ResponseWriter, r *http.Request) { e.serveChannel(rw, r, ls) })
	mux.HandleFunc("GET /otel", func(rw http.ResponseWriter, r *http.Request) { e.serveTelemetry(rw, r, ls) })
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if p.refuseHost(rw, r) {
			return
		}
		mux.ServeHTTP(rw, r)
	})
}

// Close stops the engine: new connections are refused, in-flight calls fail,
// every socket closes and every in-process handler's context ends. It returns
// once every goroutine the engine started has finished, or when ctx ends
// (then with ctx's error).
func (e *Engine) Close(ctx context.Context) error {
	if !e.closed.CompareAndSwap(false, true) {
		return e.waitTasks(ctx)
	}
	e.tasks.Close()
	e.cancel()

	e.workersMu.RLock()
	all := make([]*worker, 0, len(e.workers))
	for _, w := range e.workers {
		all = append(all, w)
	}
	e.workersMu.RUnlock()
	for _, w := range all {
		if w.conn != nil {
			w.conn.shutdown(statusGoingAway, "engine stopping")
		} else {
			w.teardown()
		}
	}
	e.pending.failAll(&protocol.ErrorBody{Code: protocol.CodeInvocationStopped, Message: "engine stopped"})
	e.channels.removeAll()
	return e.waitTasks(ctx)
}

func (e *Engine) waitTasks(ctx context.Context) error {
	if err := e.tasks.Wait(ctx); err != nil {
		return fmt.Errorf("engine close: %w", err)
	}
	return nil
}

// Invoke calls any function, local or remote, from inside the engine.
// namespace "" means DefaultNamespace. Errors the function (or the engine)
// returns come back as *protocol.ErrorBody; ctx ending returns ctx's error.
func (e *Engine) Invoke(ctx context.Context, namespace, functionID string, data json.RawMessage) (json.RawMessage, error) {
	return e.InvokeAs(ctx, Caller{p: adminPrincipal}, namespace, functionID, data, nil)
}

// CreateChannel is engine::channels::create for in-process users. The
// channel has no owning worker; the TTL sweep removes it if it is never
// fully taken. bufferSize <= 0 means the default (64); it is capped at 1024.
func (e *Engine) CreateChannel(bufferSize int) (writer, reader protocol.StreamChannelRef) {
	ch := e.channels.create(e, bufferSize, "")
	return ch.refs()
}

func (e *Engine) lookupWorker(id string) *worker {
	e.workersMu.RLock()
	w := e.workers[id]
	e.workersMu.RUnlock()
	return w
}

func (e *Engine) addWorker(w *worker) {
	e.workersMu.Lock()
	e.workers[w.id] = w
	e.workersMu.Unlock()
}

func (e *Engine) removeWorker(w *worker) {
	e.workersMu.Lock()
	if e.workers[w.id] == w {
		delete(e.workers, w.id)
	}
	e.workersMu.Unlock()
}

func (e *Engine) snapshotWorkers() []*worker {
	e.workersMu.RLock()
	defer e.workersMu.RUnlock()
	out := make([]*worker, 0, len(e.workers))
	for _, w := range e.workers {
		out = append(out, w)
	}
	return out
}
