// Package stream is the iii-stream engine worker of iii 0.26 (deprecated
// there, still accepted): durable streams of JSON items, organised as
// stream > group > item, served as stream::* in the default namespace, the
// trigger types stream, stream:join and stream:leave, and a WebSocket
// listener (port 3112 by default, loopback unless configured otherwise) on
// which clients join a group or an item and receive every change.
//
// The items live in a backend: the built-in kv adapter, in memory or
// persisted as one JSON file written atomically (Store), or Redis, shared
// with other engines (iii's or upstream's) that use the same Redis, whose
// change events then reach every engine's subscribers (redis.go).
// Everything a client can send, and everything read back from Redis, is
// bounded (Limits). docs/stream.md describes the protocol.
package stream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/dropqueue"
	"github.com/iii-sandbox/iii/internal/loopback"
)

// WorkerName is the worker's name in the engine.
const WorkerName = "iii-stream"

// Trigger types the worker provides.
const (
	TriggerStream = "stream"
	TriggerJoin   = "stream:join"
	TriggerLeave  = "stream:leave"
)

const (
	// triggerQueue bounds the change events waiting for their stream
	// triggers (over all dispatchers). A writer never waits for triggers:
	// beyond it the oldest waiting event of a dispatcher is dropped and a
	// warning logged, so a trigger that writes to its own stream cannot
	// stall on its own backlog.
	triggerQueue = 1024
	// dispatchers run stream triggers, each event's in order.
	dispatchers = 4
	// callTimeout bounds one trigger, condition or auth call.
	callTimeout = 60 * time.Second
	// writeTimeout drops a client that does not read its messages.
	writeTimeout = 10 * time.Second
	// handshakeTimeout bounds the HTTP upgrade.
	handshakeTimeout = 10 * time.Second
)

// Config is the worker's configuration (config.yaml's iii-stream entry).
type Config struct {
	Host string
	Port int // 0 picks a free port
	// AuthFunction, when set, is called at every WebSocket upgrade; a
	// failure refuses the connection.
	AuthFunction string
	// Backend is BackendKV ("" too) or BackendRedis.
	Backend string
	// RedisURL is the redis backend's Redis ("" = DefaultRedisURL).
	RedisURL string
	// StoreDir is where the kv store persists; "" keeps it in memory.
	StoreDir string
	// SaveInterval is how often a changed store is written (and at Close).
	SaveInterval time.Duration
	// ChannelSize is each connection's queue of undelivered messages; when
	// it is full the oldest is dropped.
	ChannelSize int
	Limits      Limits
}

// Options configure Start.
type Options struct {
	Logger  hclog.Logger // nil = null logger
	Version string
	Config  Config
}

// Worker is a running iii-stream worker.
type Worker struct {
	cfg    Config
	limits Limits
	log    hclog.Logger
	eng    *engine.Engine
	store  backend
	lw     *engine.LocalWorker

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	trig   triggerSet
	queues []*dropqueue.Queue[dispatchJob] // one per dispatcher
	hub    hub
	wg     sync.WaitGroup // dispatchers and the HTTP server

	srv      *http.Server
	addr     string
	loopback bool // bound to a loopback address: only loopback Hosts are served

	closeOnce sync.Once
	closeErr  error
}

// Start opens the backend (loading what the kv store persisted, or
// reaching Redis within RedisDialTimeout), registers stream::* and the
// trigger types with eng, and starts the listener. On error nothing is left
// running.
func Start(ctx context.Context, eng *engine.Engine, opts Options) (*Worker, error) {
	cfg := opts.Config
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if cfg.ChannelSize <= 0 {
		cfg.ChannelSize = 256
	}
	w := &Worker{cfg: cfg, limits: cfg.Limits.withDefaults(), log: log, eng: eng}
	w.trig.init()
	w.hub.init()
	var err error
	if w.store, err = w.openBackend(ctx); err != nil {
		return nil, err
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	for range dispatchers {
		w.queues = append(w.queues, dropqueue.Start(&w.wg, triggerQueue/dispatchers, w.runJob, w.logDropped))
	}
	if err := w.attach(opts.Version); err != nil {
		w.abort()
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)))
	if err != nil {
		w.abort()
		return nil, errorf(CodeListenFailed, "%s cannot listen on %s: %v; stop whatever holds that address or give iii-stream another port in config.yaml",
			WorkerName, net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), err)
	}
	w.addr = ln.Addr().String()
	w.loopback = loopback.Addr(w.addr)
	w.srv = &http.Server{
		Handler:           http.HandlerFunc(w.serveHTTP),
		ReadHeaderTimeout: handshakeTimeout,
		ErrorLog:          log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		if err := w.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("stream socket stopped", "error", err)
		}
	}()
	log.Info("stream worker started", "addr", w.addr, "adapter", backendName(cfg.Backend), "store", w.store.Where())
	return w, nil
}

func backendName(b string) string {
	if b == "" {
		return BackendKV
	}
	return b
}

// openBackend opens the backend w.cfg names; the events it delivers go to
// the worker's socket subscribers (w.hub, ready before).
func (w *Worker) openBackend(ctx context.Context) (backend, error) {
	switch w.cfg.Backend {
	case "", BackendKV:
		st, err := OpenStore(w.cfg.StoreDir, w.cfg.SaveInterval, w.limits)
		if err != nil {
			return nil, err
		}
		return kvBackend{Store: st, deliver: w.hub.broadcast}, nil
	case BackendRedis:
		return openRedis(ctx, w.cfg.RedisURL, w.limits, w.log, w.hub.broadcast)
	}
	return nil, errorf(CodeInvalidInput, "%s: adapter %q is not kv or redis", WorkerName, w.cfg.Backend)
}

// attach registers the worker, its functions and trigger types.
func (w *Worker) attach(version string) error {
	lw, err := w.eng.AttachLocalWorker(engine.LocalWorkerSpec{
		Name:        WorkerName,
		Namespace:   engine.DefaultNamespace,
		Description: "Durable streams for real-time data subscriptions (deprecated in iii 0.26)",
		Runtime:     "engine",
		Version:     version,
		PID:         os.Getpid(),
	})
	if err != nil {
		return fmt.Errorf("attach %s: %w", WorkerName, err)
	}
	for _, f := range w.functions() {
		if err := lw.RegisterFunction(f.def, f.handler); err != nil {
			lw.Detach()
			return fmt.Errorf("register %s: %w", f.def.ID, err)
		}
	}
	for _, tt := range []struct{ id, desc string }{
		{TriggerStream, "Fires when an item of a stream changes (stream::set, stream::update, stream::delete) or stream::send sends an event"},
		{TriggerJoin, "Fires when a client joins a stream group on the stream socket; answering {unauthorized: true} refuses it"},
		{TriggerLeave, "Fires when a client leaves a stream group or disconnects"},
	} {
		if err := lw.RegisterTriggerType(tt.id, tt.desc, &w.trig); err != nil {
			lw.Detach()
			return fmt.Errorf("register trigger type %s: %w", tt.id, err)
		}
	}
	w.lw = lw
	return nil
}

// Addr is the listener's bound address (host:port).
func (w *Worker) Addr() string { return w.addr }

// Store describes where the items live: the kv store's file, "in memory",
// or the (redacted) Redis URL.
func (w *Worker) Store() string { return w.store.Where() }

// abort undoes a partial Start.
func (w *Worker) abort() {
	if w.lw != nil {
		w.lw.Detach()
	}
	w.cancel()
	w.stopDispatch()
	w.hub.close()
	w.wg.Wait()
	if err := w.store.Close(); err != nil {
		w.log.Error("close the stream store", "error", err)
	}
}

// Close withdraws stream::* and the trigger types, closes the listener and
// every connection, waits for the triggers in flight and saves the store.
// ctx bounds the wait for the HTTP server.
func (w *Worker) Close(ctx context.Context) error {
	w.closeOnce.Do(func() {
		w.lw.Detach()
		// Cancelled first, so an upgrade waiting on the auth function
		// ends now rather than hold Shutdown up.
		w.cancel()
		var errs []error
		if err := w.srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop the stream socket: %w", err))
			_ = w.srv.Close()
		}
		w.stopDispatch()
		w.hub.close()
		w.wg.Wait()
		if err := w.store.Close(); err != nil {
			errs = append(errs, err)
		}
		w.closeErr = errors.Join(errs...)
	})
	return w.closeErr
}
