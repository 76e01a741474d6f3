package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/host/configuration"
	"github.com/iii-sandbox/iii/host/stream"
	"github.com/iii-sandbox/iii/internal/atomicfile"
)

// The iii-stream worker runs with the configuration worker's entry
// "iii-stream" (docs/stream.md#settings), as in iii 0.26: config.yaml's
// block seeds the entry when none is stored, the worker starts with the
// entry's value, `configuration::set` of the entry re-applies it at run
// time, and once the value is stored the block is taken out of
// config.yaml (a comment says where the value lives), so nobody edits a
// block that is no longer read.

// streamState is the iii-stream worker config.yaml declares (none when
// it declares none).
type streamState struct {
	mu sync.Mutex
	// cfg is the file's entry as last applied (the seed); run is what the
	// worker runs with (the configuration entry's value).
	cfg, run *config.Stream
	w        *stream.Worker
	// unsubscribe ends the watch of the configuration entry.
	unsubscribe func()
}

func streamConfig(c *config.Stream) stream.Config {
	dir := c.FilePath
	if c.StoreMethod == config.StoreInMemory {
		dir = ""
	}
	sc := stream.Config{Host: c.Host, Port: c.Port, AuthFunction: c.AuthFunction, Backend: stream.BackendKV, StoreDir: dir,
		SaveInterval: c.SaveInterval, ChannelSize: c.ChannelSize}
	if c.Adapter == config.StreamAdapterRedis {
		sc.Backend, sc.RedisURL, sc.StoreDir = stream.BackendRedis, c.RedisURL, ""
	}
	return sc
}

// syncStream makes the running iii-stream worker match next: started,
// stopped, or restarted on a change of the file's entry (the store is
// saved on the stop and read back on the start, so its data stays).
func (s *Server) syncStream(ctx context.Context, next *config.Stream) error {
	unsubscribe, err := s.syncStreamLocked(ctx, next)
	if unsubscribe != nil {
		// Outside the lock: it waits for a running callback, which takes it.
		unsubscribe()
	}
	return err
}

func (s *Server) syncStreamLocked(ctx context.Context, next *config.Stream) (unsubscribe func(), err error) {
	st := &s.stream
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.cfg != nil && next != nil && *st.cfg == *next {
		return nil, nil
	}
	s.stopStreamLocked(ctx)
	if next == nil {
		unsubscribe, st.unsubscribe = st.unsubscribe, nil
		return unsubscribe, nil
	}
	run := s.streamSettings(ctx, next)
	if err := s.startStreamLocked(ctx, run); err != nil {
		return nil, err
	}
	c := *next
	st.cfg = &c
	if cw := s.Configuration(); st.unsubscribe == nil && cw != nil {
		st.unsubscribe = cw.Subscribe(s.streamEntryChanged)
	}
	return nil, nil
}

// streamConfigurationReplaced moves the stream worker to a new
// configuration worker (a reload renamed it): its entry is registered
// there (seeded from the file if the new store holds none), watched there,
// and applied.
func (s *Server) streamConfigurationReplaced(ctx context.Context) {
	st := &s.stream
	st.mu.Lock()
	old := st.unsubscribe
	st.unsubscribe = nil
	st.mu.Unlock()
	if old != nil {
		old() // the old worker's Close already ended it; this only tidies
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.w == nil || st.cfg == nil {
		return
	}
	cw := s.Configuration()
	if cw == nil {
		return
	}
	run := s.streamSettings(ctx, st.cfg)
	st.unsubscribe = cw.Subscribe(s.streamEntryChanged)
	if *run != *st.run {
		s.restartStreamLocked(ctx, run)
	}
}

func (s *Server) startStreamLocked(ctx context.Context, run *config.Stream) error {
	w, err := stream.Start(ctx, s.eng, stream.Options{Logger: s.log.Named(stream.WorkerName), Version: s.opts.Version, Config: streamConfig(run)})
	if err != nil {
		return err
	}
	s.stream.w, s.stream.run = w, run
	return nil
}

func (s *Server) stopStreamLocked(ctx context.Context) {
	st := &s.stream
	if st.w == nil {
		return
	}
	if err := st.w.Close(ctx); err != nil {
		s.log.Warn("stop the stream worker", "error", err)
	}
	st.w, st.cfg, st.run = nil, nil, nil
	s.log.Info("stream worker stopped")
}

// streamSettings registers the iii-stream entry, seeded with the file's
// settings when no value is stored, and returns the entry's value as
// settings. Where the entry cannot be used (its store fails, or a hand
// edit left a value the checks refuse) the file's settings serve, and
// the log says why.
func (s *Server) streamSettings(ctx context.Context, seed *config.Stream) *config.Stream {
	cw := s.Configuration()
	if cw == nil {
		return seed
	}
	if _, err := cw.Ensure(ctx, configuration.RegisterRequest{
		ID: config.StreamEntryID, Name: "Stream",
		Description: "iii-stream settings: host/port of the stream socket, the connection auth function, and the store: the built-in kv, or redis for several engines on one Redis (docs/stream.md).",
		Schema:      config.StreamEntrySchema(), InitialValue: seed.SeedValue(),
	}); err != nil {
		s.log.Warn("cannot register the iii-stream configuration entry; running with config.yaml's settings", "error", err)
		return seed
	}
	value, err := cw.Get(ctx, config.StreamEntryID, false)
	if err != nil || isNull(value) {
		return seed
	}
	run, err := config.StreamFromEntry(seed.Name, value, s.cfgDir())
	if err != nil {
		s.log.Warn("the iii-stream configuration entry is not usable; running with config.yaml's settings", "error", err)
		return seed
	}
	return run
}

// streamEntryChanged re-applies the entry when its value changes: the
// worker restarts with the new settings (its data stays), and goes back
// to the old ones if the new cannot start (a port in use).
func (s *Server) streamEntryChanged(ev configuration.Event) {
	if ev.ID != config.StreamEntryID || ev.EventType == configuration.EventDeleted || isNull(ev.NewValue) {
		return
	}
	st := &s.stream
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.w == nil || st.cfg == nil {
		return
	}
	next, err := config.StreamFromEntry(st.cfg.Name, ev.NewValue, s.cfgDir())
	if err != nil {
		s.log.Warn("the changed iii-stream configuration entry is not usable; the stream worker keeps its settings", "error", err)
		return
	}
	if *next == *st.run {
		return
	}
	if s.restartStreamLocked(context.Background(), next) {
		s.log.Info("stream worker restarted with the changed iii-stream configuration entry", "addr", st.w.Addr())
	}
}

// restartStreamLocked restarts the running stream worker with next, or
// with the settings it had when next cannot start (a port in use); it
// reports whether next is in force.
func (s *Server) restartStreamLocked(ctx context.Context, next *config.Stream) bool {
	st := &s.stream
	prev, file := st.run, st.cfg
	_ = st.w.Close(ctx)
	st.w = nil
	err := s.startStreamLocked(ctx, next)
	if err == nil {
		return true
	}
	s.log.Error("the stream worker cannot start with its new settings; back to its previous ones", "error", err)
	if err := s.startStreamLocked(ctx, prev); err != nil {
		s.log.Error("the stream worker cannot start again with its previous settings either; it is stopped", "error", err)
		st.run, st.cfg = nil, nil
		return false
	}
	st.cfg = file
	return false
}

// stripSeededStreamBlock takes the iii-stream block out of config.yaml
// once the entry holds a stored value, leaving a comment that says where
// the value lives. Best effort: a file that cannot be written keeps its
// block, which is then simply not read.
func (s *Server) stripSeededStreamBlock(ctx context.Context) {
	s.mu.Lock()
	cfg := s.cfg
	s.mu.Unlock()
	cw := s.Configuration()
	if cfg == nil || cfg.Stream == nil || cw == nil {
		return
	}
	if raw, err := cw.Get(ctx, config.StreamEntryID, true); err != nil || isNull(raw) {
		return
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return
	}
	where := filepath.Join(cfg.Configuration.Directory, config.StreamEntryID+".yaml")
	comment := fmt.Sprintf("# '%s': value now lives in the configuration worker at %s. Edit it at run time with `iii call configuration::set` (docs/stream.md); this block is no longer read.",
		config.StreamEntryID, where)
	out, ok := config.StripWorkerConfig(data, cfg.Stream.Name, comment)
	if !ok {
		return
	}
	next, err := config.ParseFile(s.path, out, s.lookup)
	if err != nil {
		s.log.Warn("not taking the seeded iii-stream block out of config.yaml: the file would not read back", "error", err)
		return
	}
	fi, err := os.Stat(s.path)
	if err != nil {
		return
	}
	if err := atomicfile.Write(s.path, out, fi.Mode().Perm()); err != nil {
		s.log.Debug("cannot take the seeded iii-stream block out of config.yaml; it stays and is not read", "error", err)
		return
	}
	// The engine's own edit is not a change to apply: the watcher sees the
	// state it already has, and the next reload compares with this file.
	s.mu.Lock()
	s.cfg, s.fileState = next, stateOf(out, nil)
	s.mu.Unlock()
	s.stream.mu.Lock()
	if next.Stream != nil && s.stream.cfg != nil {
		c := *next.Stream
		s.stream.cfg = &c
	}
	s.stream.mu.Unlock()
	s.log.Info("took the seeded iii-stream block out of config.yaml; its value lives in the configuration worker", "entry", where)
}

func isNull(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }

// cfgDir is the directory config.yaml's relative paths resolve against.
func (s *Server) cfgDir() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg != nil {
		return s.cfg.Dir
	}
	return filepath.Dir(s.path)
}

// StreamAddr is the iii-stream socket's bound address, "" when the worker
// does not run.
func (s *Server) StreamAddr() string {
	s.stream.mu.Lock()
	defer s.stream.mu.Unlock()
	if s.stream.w == nil {
		return ""
	}
	return s.stream.w.Addr()
}

// closeStream stops the iii-stream worker at shutdown.
func (s *Server) closeStream(ctx context.Context) error {
	s.stream.mu.Lock()
	unsubscribe := s.stream.unsubscribe
	s.stream.unsubscribe = nil
	var err error
	if s.stream.w != nil {
		err = s.stream.w.Close(ctx)
		s.stream.w, s.stream.cfg, s.stream.run = nil, nil, nil
	}
	s.stream.mu.Unlock()
	if unsubscribe != nil {
		unsubscribe()
	}
	return err
}
