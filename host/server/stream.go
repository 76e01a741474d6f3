package server

import (
	"context"
	"sync"

	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/host/stream"
)

// streamState is the iii-stream worker config.yaml declares (none when
// it declares none).
type streamState struct {
	mu  sync.Mutex
	cfg *config.Stream
	w   *stream.Worker
}

func streamConfig(c *config.Stream) stream.Config {
	dir := c.FilePath
	if c.StoreMethod == config.StoreInMemory {
		dir = ""
	}
	return stream.Config{Host: c.Host, Port: c.Port, AuthFunction: c.AuthFunction, StoreDir: dir,
		SaveInterval: c.SaveInterval, ChannelSize: c.ChannelSize}
}

// syncStream makes the running iii-stream worker match next: started,
// stopped, or restarted on a change (the store is saved on the stop and
// read back on the start, so its data stays).
func (s *Server) syncStream(ctx context.Context, next *config.Stream) error {
	st := &s.stream
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.cfg != nil && next != nil && *st.cfg == *next {
		return nil
	}
	if st.w != nil {
		if err := st.w.Close(ctx); err != nil {
			s.log.Warn("stop the stream worker", "error", err)
		}
		st.w, st.cfg = nil, nil
		s.log.Info("stream worker stopped")
	}
	if next == nil {
		return nil
	}
	w, err := stream.Start(ctx, s.eng, stream.Options{Logger: s.log.Named(stream.WorkerName), Version: s.opts.Version, Config: streamConfig(next)})
	if err != nil {
		return err
	}
	c := *next
	st.w, st.cfg = w, &c
	return nil
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
	defer s.stream.mu.Unlock()
	if s.stream.w == nil {
		return nil
	}
	err := s.stream.w.Close(ctx)
	s.stream.w, s.stream.cfg = nil, nil
	return err
}
