package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Port is the agent's end of the channel. Read returns io.EOF while no host
// is connected and works again once one connects (this is how a
// virtio-console port behaves); any other error means the port is gone.
// Write may block while no host is connected.
type Port interface {
	io.Reader
	io.Writer
}

// ExecIO connects a process to its stream.
type ExecIO struct {
	// Stdin yields standard-input chunks and io.EOF at the end. Nil
	// connects standard input to /dev/null.
	Stdin func(ctx context.Context) ([]byte, error)
	// Stdout and Stderr take output chunks, which they may keep. An error
	// means nobody is listening: output is then read and dropped.
	Stdout func(ctx context.Context, p []byte) error
	Stderr func(ctx context.Context, p []byte) error
	// Started is told the pid once the process runs.
	Started func(pid int)
	// Attached, for proc_attach, is told the pid of the process taken
	// over and how much of its output was dropped while detached.
	Attached func(pid int, dropped int64)
}

// Runner runs exec requests (Executor in the guest).
type Runner interface {
	Run(ctx context.Context, req *agentproto.ExecRequest, eio ExecIO) (*agentproto.ExitStatus, error)
}

// NetConfigurer configures the guest network.
type NetConfigurer interface {
	Configure(ctx context.Context, req *agentproto.NetRequest) (*agentproto.NetResult, error)
}

// ProcRunner runs named, long-lived processes (Supervisor in the guest).
type ProcRunner interface {
	Run(ctx context.Context, req *agentproto.SpawnRequest, eio ExecIO) (*agentproto.ExitStatus, error)
	Stop(ctx context.Context, req *agentproto.ProcStopRequest) (*agentproto.ProcStopResult, error)
	// Attach streams a kept process again (agentproto.ProcAttachRequest).
	Attach(ctx context.Context, req *agentproto.ProcAttachRequest, eio ExecIO) (*agentproto.ExitStatus, error)
}

// WorkspaceUnpacker lays a tar stream into a directory (Workspace).
type WorkspaceUnpacker interface {
	Unpack(ctx context.Context, req *agentproto.WorkspaceRequest, r io.Reader) (*agentproto.WorkspaceResult, error)
}

// Server serves the agent protocol on a Port.
type Server struct {
	Port Port
	Exec Runner
	FS   *FS
	// Procs serves spawn and proc_stop; nil leaves the capability out.
	Procs ProcRunner
	// Workspace serves workspace; nil leaves the capability out.
	Workspace WorkspaceUnpacker
	// Net serves net requests; nil leaves the capability out.
	Net NetConfigurer
	// NetStats serves net_stats; nil leaves the capability out.
	NetStats NetStatsReader
	// Reseed serves reseed; nil leaves the capability out.
	Reseed func(ctx context.Context, req *agentproto.ReseedRequest) (*agentproto.ReseedResult, error)
	// PowerOff runs after the reply to a shutdown request is written; nil
	// leaves the capability out.
	PowerOff func() error
	// Hello holds the facts the agent reports (version, arch, kernel, root,
	// boot time); the server fills in role, protocol, nonce, capabilities.
	Hello agentproto.Hello
	// Uptime, when set, fills Hello.UptimeMS.
	Uptime func() time.Duration
	Log    hclog.Logger
	// MaxStreams bounds concurrent operations per connection.
	MaxStreams int
}

const (
	defaultMaxStreams = 1024
	// While no host is connected every read returns EOF at once; polling
	// starts fast (the host usually connects during boot and time to HELLO
	// matters) and slows down so an idle, unconnected VM costs little.
	pollMin = 2 * time.Millisecond
	pollMax = 50 * time.Millisecond
)

var (
	errStale        = errors.New("guest: connection replaced")
	errSessionEnded = errors.New("guest: host disconnected")
	// errCanceledByHost is the cause of a stream's context when the host
	// sent Cancel on it, as opposed to the connection ending: a kept
	// process dies of the first and outlives the second.
	errCanceledByHost = errors.New("guest: canceled by the host")
)

// canceledByHost reports whether ctx, a stream's, ended because the host
// canceled the stream.
func canceledByHost(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errCanceledByHost)
}

func (s *Server) log() hclog.Logger {
	if s.Log == nil {
		return hclog.NewNullLogger()
	}
	return s.Log
}

func (s *Server) capabilities() []string {
	var caps []string
	for _, c := range agentproto.AllCapabilities() {
		if (c == agentproto.CapNet && s.Net == nil) || (c == agentproto.CapShutdown && s.PowerOff == nil) ||
			((c == agentproto.CapSpawn || c == agentproto.CapProcAttach) && s.Procs == nil) || (c == agentproto.CapWorkspace && s.Workspace == nil) ||
			(c == agentproto.CapNetStats && s.NetStats == nil) || (c == agentproto.CapReseed && s.Reseed == nil) {
			continue
		}
		caps = append(caps, c)
	}
	return caps
}

// Serve answers connections until ctx ends or the port fails. Each
// connection starts with the host's hello; a new hello after a disconnect
// starts a fresh session, and the operations of the old one are canceled.
func (s *Server) Serve(ctx context.Context) error {
	wctx, stopWriter := context.WithCancel(ctx)
	w := newPortWriter(s.Port, s.log())
	var wdone sync.WaitGroup
	wdone.Add(1)
	go func() { defer wdone.Done(); w.run(wctx) }()
	defer func() { stopWriter(); w.wake(); wdone.Wait() }()

	br := bufio.NewReaderSize(eofReader{s.Port}, 64<<10)
	poll := pollMin
	for ctx.Err() == nil {
		if err := agentproto.SkipToMagic(br); err != nil {
			if errors.Is(err, io.EOF) {
				br.Reset(eofReader{s.Port})
				sleepCtx(ctx, poll)
				poll = min(poll*2, pollMax)
				continue
			}
			if errors.Is(err, agentproto.ErrNoMagic) {
				s.log().Warn("no hello from the host; still looking")
				continue
			}
			return fmt.Errorf("guest: read port: %w", err)
		}
		poll = pollMin
		f, err := agentproto.ReadFrameBuffered(br)
		if err != nil {
			if isPortFailure(err) {
				return fmt.Errorf("guest: read port: %w", err)
			}
			continue
		}
		if f.Kind != agentproto.KindHello {
			continue
		}
		h, err := agentproto.DecodeHello(f.Payload)
		if err != nil || h.Role != agentproto.RoleHost {
			s.log().Warn("bad hello from the host", "error", err)
			continue
		}
		gen := w.newSession()
		if err := s.sendHello(w, gen, h); err != nil {
			continue
		}
		if err := agentproto.CheckCompatible(h); err != nil {
			s.log().Warn("host speaks another protocol major; it will hang up", "host_major", h.ProtocolMajor)
		}
		sess := newSession(ctx, s, w, gen)
		err = sess.serve(br)
		for errors.Is(err, io.EOF) && s.hostBack(ctx, br) {
			// A stale "host disconnected" (see hostBack): the same
			// host is still there, and so is its session.
			err = sess.serve(br)
		}
		sess.close()
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			s.log().Debug("host disconnected")
			br.Reset(eofReader{s.Port})
		case isPortFailure(err):
			return fmt.Errorf("guest: read port: %w", err)
		case errors.Is(err, errNewHello):
			s.log().Debug("a new host said hello; its session replaces this one")
		default:
			// A framing error: keep what is buffered, the host's next
			// hello may already be in it.
			s.log().Warn("protocol error; waiting for a new hello", "error", err)
		}
	}
	return ctx.Err()
}

// disconnectGrace is how long a session outlives an end of file from the
// port before it ends.
const disconnectGrace = 300 * time.Millisecond

// hostBack reports whether the port has bytes again within
// disconnectGrace after an end of file between frames. The port's "host
// connected" state reaches the guest as control events, processed apart
// from the data: a VM restored from a snapshot template can process the
// template's own hang-up after the new host's hello, and would otherwise
// end the new session and drop the host's next requests while it waits
// for a hello that never comes. A host that really left is noticed
// disconnectGrace later. Waiting on a connected, silent port is the same
// as serving the session, so a blocked Peek is fine.
func (s *Server) hostBack(ctx context.Context, br *bufio.Reader) bool {
	deadline := time.Now().Add(disconnectGrace)
	for ctx.Err() == nil {
		if _, err := br.Peek(1); err == nil {
			s.log().Debug("the port came back within the grace; the session goes on")
			return true
		} else if !errors.Is(err, io.EOF) {
			return false
		}
		if !time.Now().Before(deadline) {
			return false
		}
		sleepCtx(ctx, pollMin)
	}
	return false
}

// errNewHello ends a session whose byte stream continues with another
// host's hello.
var errNewHello = errors.New("a new hello follows")

func isPortFailure(err error) bool {
	var pe *portError
	return errors.As(err, &pe)
}

func (s *Server) sendHello(w *portWriter, gen uint64, from *agentproto.Hello) error {
	h := s.Hello
	h.Role = agentproto.RoleAgent
	h.ProtocolMajor, h.ProtocolMinor = agentproto.ProtocolMajor, agentproto.ProtocolMinor
	h.Nonce = from.Nonce
	h.Capabilities = s.capabilities()
	if s.Uptime != nil {
		h.UptimeMS = s.Uptime().Milliseconds()
	}
	p, err := json.Marshal(h)
	if err != nil {
		return err
	}
	buf := []byte(agentproto.Magic)
	buf, err = agentproto.AppendFrame(buf, agentproto.Frame{Kind: agentproto.KindHello, Payload: p})
	if err != nil {
		return err
	}
	return w.enqueueRaw(gen, buf, nil)
}

// portError marks a read error that is not a disconnect.
type portError struct{ err error }

func (e *portError) Error() string { return e.err.Error() }
func (e *portError) Unwrap() error { return e.err }

// eofReader passes io.EOF through and marks every other error as a port
// failure, so the framing layer's own errors stay distinguishable.
type eofReader struct{ r io.Reader }

func (e eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = &portError{err}
	}
	return n, err
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// portWriter is the one goroutine that writes to the port. Frames carry the
// session generation they belong to; when a new connection starts, frames
// queued for the old one are dropped instead of confusing the new host.
type portWriter struct {
	w     io.Writer
	log   hclog.Logger
	mu    sync.Mutex
	gen   uint64
	queue []outItem
	sig   chan struct{}
}

type outItem struct {
	gen  uint64
	buf  []byte
	done chan<- error
}

func newPortWriter(w io.Writer, log hclog.Logger) *portWriter {
	return &portWriter{w: w, log: log, sig: make(chan struct{}, 1)}
}

func (pw *portWriter) wake() {
	select {
	case pw.sig <- struct{}{}:
	default:
	}
}

// newSession starts a generation and drops what the previous one queued.
func (pw *portWriter) newSession() uint64 {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	pw.gen++
	for _, it := range pw.queue {
		if it.done != nil {
			it.done <- errStale
		}
	}
	pw.queue = nil
	return pw.gen
}

func (pw *portWriter) enqueue(gen uint64, frames []agentproto.Frame, done chan<- error) error {
	var buf []byte
	for _, f := range frames {
		var err error
		if buf, err = agentproto.AppendFrame(buf, f); err != nil {
			return err
		}
	}
	return pw.enqueueRaw(gen, buf, done)
}

func (pw *portWriter) enqueueRaw(gen uint64, buf []byte, done chan<- error) error {
	pw.mu.Lock()
	if gen != pw.gen {
		pw.mu.Unlock()
		return errStale
	}
	pw.queue = append(pw.queue, outItem{gen: gen, buf: buf, done: done})
	pw.mu.Unlock()
	pw.wake()
	return nil
}

func (pw *portWriter) run(ctx context.Context) {
	for {
		pw.mu.Lock()
		if len(pw.queue) == 0 {
			pw.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-pw.sig:
			}
			continue
		}
		it := pw.queue[0]
		pw.queue[0] = outItem{}
		pw.queue = pw.queue[1:]
		stale := it.gen != pw.gen
		pw.mu.Unlock()
		var err error
		if stale {
			err = errStale
		} else if _, err = pw.w.Write(it.buf); err != nil {
			pw.log.Warn("write to port failed", "error", err)
			if ctx.Err() != nil {
				return
			}
			// Do not spin on a port that keeps failing.
			sleepCtx(ctx, pollMax)
		}
		if it.done != nil {
			it.done <- err
		}
	}
}

// session is one host connection.
type session struct {
	srv    *Server
	w      *portWriter
	gen    uint64
	ctx    context.Context
	cancel context.CancelFunc
	asm    agentproto.Assembler

	mu      sync.Mutex
	streams map[uint32]*stream
	maxID   uint32
	wg      sync.WaitGroup
}

type stream struct {
	id     uint32
	ctx    context.Context
	cancel context.CancelFunc
	// hostCancel ends the stream because the host sent Cancel.
	hostCancel context.CancelFunc
	send       *agentproto.SendWindow
	recv       agentproto.RecvWindow
	in         *chunkQueue // nil when the operation takes no data
	inKind     agentproto.Kind
}

func newSession(ctx context.Context, srv *Server, w *portWriter, gen uint64) *session {
	sctx, cancel := context.WithCancel(ctx)
	return &session{srv: srv, w: w, gen: gen, ctx: sctx, cancel: cancel, streams: make(map[uint32]*stream)}
}

// close ends the session: every operation is canceled (execs are killed)
// and waited for.
func (s *session) close() {
	s.cancel()
	s.mu.Lock()
	for _, st := range s.streams {
		st.cancel()
		st.send.Close(errSessionEnded)
		if st.in != nil {
			st.in.close(errSessionEnded)
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *session) serve(br *bufio.Reader) error {
	// readied: a frame since the last yield handed work to another
	// goroutine (a new operation, input, send credit).
	readied := false
	for {
		if readied && !agentproto.FrameBuffered(br) {
			// The next read blocks in a syscall on the port, and a
			// goroutine blocked in a syscall keeps its P until sysmon
			// takes it back: with one vCPU (GOMAXPROCS 1) the work just
			// handed out would wait for that, a whole timer tick (4 ms)
			// on a guest kernel without high-resolution timers. Let it
			// run first; it parks again at its own next wait.
			readied = false
			runtime.Gosched()
		}
		// A new host connection reaches the port as more bytes of the same
		// stream (QEMU's chardev gives the guest no end of file), so the
		// next host's Magic and hello can follow this session's frames.
		// No frame header starts with Magic's first byte (a length below
		// MaxPayload); leave it buffered for the hello loop.
		if agentproto.AtMagic(br) {
			return errNewHello
		}
		f, err := agentproto.ReadFrameBuffered(br)
		if err != nil {
			return err
		}
		switch {
		case f.Kind == agentproto.KindControl || f.Kind == agentproto.KindControlPart:
			msg, done, err := s.asm.Add(f)
			if err != nil {
				s.replyError(f.Stream, agentproto.CodeProtocol, err.Error())
				continue
			}
			if done {
				s.control(f.Stream, msg)
				readied = true
			}
		case f.Kind == agentproto.KindWindow:
			n, err := agentproto.ParseWindow(f.Payload)
			if err != nil {
				return err
			}
			if st := s.lookup(f.Stream); st != nil {
				st.send.Grant(int(n))
				readied = true
			}
		case f.Kind.IsData():
			s.data(f)
			readied = true
		case f.Kind == agentproto.KindHello:
			return errors.New("hello inside a session")
		}
	}
}

func (s *session) lookup(id uint32) *stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[id]
}

func (s *session) data(f agentproto.Frame) {
	st := s.lookup(f.Stream)
	if st == nil || st.in == nil || st.inKind != f.Kind {
		return // the operation has ended or takes no such data
	}
	if len(f.Payload) == 0 {
		st.in.close(io.EOF)
		return
	}
	if err := st.recv.Received(len(f.Payload)); err != nil {
		st.in.close(err)
		st.cancel()
		return
	}
	st.in.push(f.Payload)
}

func (s *session) control(id uint32, msg []byte) {
	m, err := agentproto.DecodeMessage(msg)
	if st := s.lookup(id); st != nil {
		if _, ok := m.(*agentproto.Cancel); ok {
			st.hostCancel()
		}
		return
	}
	if _, ok := m.(*agentproto.Cancel); ok {
		return // the operation already ended
	}
	s.mu.Lock()
	fresh := id != 0 && id > s.maxID
	if fresh {
		s.maxID = id
	}
	full := len(s.streams) >= s.maxStreams()
	s.mu.Unlock()
	switch {
	case !fresh:
		s.replyError(id, agentproto.CodeProtocol, fmt.Sprintf("stream id %d is not new on this connection", id))
		return
	case errors.Is(err, agentproto.ErrUnknownMessage):
		s.replyError(id, agentproto.CodeUnsupported, err.Error())
		return
	case err != nil:
		s.replyError(id, agentproto.CodeProtocol, err.Error())
		return
	case full:
		s.replyError(id, agentproto.CodeInternal, "too many concurrent operations on this connection")
		return
	}
	switch m := m.(type) {
	case *agentproto.ExecRequest:
		st := s.open(id, m.Stdin, agentproto.KindStdin)
		s.spawn(st, func() { s.exec(st, m) })
	case *agentproto.FSRequest:
		st := s.open(id, m.Op == agentproto.OpWrite, agentproto.KindFile)
		s.spawn(st, func() { s.fs(st, m) })
	case *agentproto.NetRequest:
		st := s.open(id, false, 0)
		s.spawn(st, func() { s.net(st, m) })
	case *agentproto.ReseedRequest:
		st := s.open(id, false, 0)
		s.spawn(st, func() { s.reseed(st, m) })
	case *agentproto.NetStatsRequest:
		st := s.open(id, false, 0)
		s.spawn(st, func() { s.netStats(st, m) })
	case *agentproto.ShutdownRequest:
		st := s.open(id, false, 0)
		s.spawn(st, func() { s.shutdown(st) })
	case *agentproto.SpawnRequest:
		st := s.open(id, false, 0)
		s.spawn(st, func() { s.spawnProc(st, m) })
	case *agentproto.ProcStopRequest:
		st := s.open(id, false, 0)
		s.spawn(st, func() { s.procStop(st, m) })
	case *agentproto.ProcAttachRequest:
		st := s.open(id, false, 0)
		s.spawn(st, func() { s.procAttach(st, m) })
	case *agentproto.WorkspaceRequest:
		st := s.open(id, true, agentproto.KindFile)
		s.spawn(st, func() { s.workspace(st, m) })
	default:
		s.replyError(id, agentproto.CodeProtocol, fmt.Sprintf("%q cannot open a stream", m.MessageType()))
	}
}

func (s *session) maxStreams() int {
	if s.srv.MaxStreams > 0 {
		return s.srv.MaxStreams
	}
	return defaultMaxStreams
}

func (s *session) open(id uint32, withInput bool, kind agentproto.Kind) *stream {
	ctx, cancel := context.WithCancelCause(s.ctx)
	st := &stream{id: id, ctx: ctx, send: agentproto.NewSendWindow(),
		cancel: func() { cancel(nil) }, hostCancel: func() { cancel(errCanceledByHost) }}
	if withInput {
		st.inKind = kind
		st.in = newChunkQueue(func(n int) { s.grant(id, n) })
	}
	s.mu.Lock()
	s.streams[id] = st
	s.mu.Unlock()
	return st
}

func (s *session) spawn(st *stream, fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.streams, st.id)
			s.mu.Unlock()
			st.cancel()
			st.send.Close(errSessionEnded)
			if st.in != nil {
				st.in.close(errSessionEnded)
			}
		}()
		fn()
	}()
}

// grant returns credit for n consumed input bytes.
func (s *session) grant(id uint32, n int) {
	if st := s.lookup(id); st != nil {
		st.recv.Consumed(n)
	}
	_ = s.w.enqueue(s.gen, []agentproto.Frame{{Kind: agentproto.KindWindow, Stream: id, Payload: agentproto.WindowPayload(uint32(n))}}, nil)
}

func (s *session) send(id uint32, m agentproto.Message) error {
	frames, err := agentproto.EncodeControl(id, m)
	if err != nil {
		return err
	}
	return s.w.enqueue(s.gen, frames, nil)
}

// sendSync queues m and waits until it has been written to the port.
func (s *session) sendSync(id uint32, m agentproto.Message, timeout time.Duration) error {
	frames, err := agentproto.EncodeControl(id, m)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	if err := s.w.enqueue(s.gen, frames, done); err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return errors.New("guest: reply not written in time")
	}
}

func (s *session) replyError(id uint32, code, msg string) {
	_ = s.send(id, &agentproto.Error{Code: code, Message: msg})
}

func (s *session) reply(id uint32, op string, body any) {
	b, err := json.Marshal(body)
	if err != nil {
		s.replyError(id, agentproto.CodeInternal, err.Error())
		return
	}
	if err := s.send(id, &agentproto.Result{Op: op, Body: b}); errors.Is(err, agentproto.ErrMessageTooBig) {
		s.replyError(id, agentproto.CodeFSIO, fmt.Sprintf("%s result is larger than %d MiB; narrow the request", op, agentproto.MaxMessage>>20))
	}
}

func (s *session) replyErr(id uint32, err error) {
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		_ = s.send(id, ae)
		return
	}
	s.replyError(id, agentproto.CodeInternal, err.Error())
}

// sendData sends p as flow-controlled data frames.
func (s *session) sendData(ctx context.Context, st *stream, kind agentproto.Kind, p []byte) error {
	for len(p) > 0 {
		n, err := st.send.Acquire(ctx, min(len(p), agentproto.ChunkSize))
		if err != nil {
			return err
		}
		f := agentproto.Frame{Kind: kind, Stream: st.id, Payload: p[:n]}
		if err := s.w.enqueue(s.gen, []agentproto.Frame{f}, nil); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// streamIO reports a process started on st and streams its output there,
// for execs and supervised processes alike.
func (s *session) streamIO(st *stream) ExecIO {
	return ExecIO{
		Started: func(pid int) { _ = s.send(st.id, &agentproto.Started{PID: pid}) },
		Stdout: func(ctx context.Context, p []byte) error {
			return s.sendData(ctx, st, agentproto.KindStdout, p)
		},
		Stderr: func(ctx context.Context, p []byte) error {
			return s.sendData(ctx, st, agentproto.KindStderr, p)
		},
	}
}

func (s *session) exec(st *stream, req *agentproto.ExecRequest) {
	if s.srv.Exec == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "exec is not served by this agent")
		return
	}
	eio := s.streamIO(st)
	if st.in != nil {
		eio.Stdin = st.in.next
	}
	status, err := s.srv.Exec.Run(st.ctx, req, eio)
	if err != nil {
		s.replyErr(st.id, err)
		return
	}
	_ = s.send(st.id, status)
}

func (s *session) fs(st *stream, req *agentproto.FSRequest) {
	if s.srv.FS == nil {
		s.replyError(st.id, agentproto.CodeFSUnsupported, "fs operations are not served by this agent")
		return
	}
	switch req.Op {
	case agentproto.OpWrite:
		res, err := s.srv.FS.Write(st.ctx, req, &queueReader{ctx: st.ctx, q: st.in})
		if err != nil {
			s.replyErr(st.id, err)
			return
		}
		s.reply(st.id, req.Op, res)
	case agentproto.OpRead:
		s.read(st, req)
	default:
		res, err := s.srv.FS.Do(st.ctx, req)
		if err != nil {
			s.replyErr(st.id, err)
			return
		}
		s.reply(st.id, req.Op, res)
	}
}

func (s *session) read(st *stream, req *agentproto.FSRequest) {
	meta, file, err := s.srv.FS.OpenRead(req)
	if err != nil {
		s.replyErr(st.id, err)
		return
	}
	defer file.Close()
	if err := s.send(st.id, meta); err != nil {
		return
	}
	var total int64
	for {
		buf := make([]byte, agentproto.ChunkSize)
		n, rerr := file.Read(buf)
		if n > 0 {
			if err := s.sendData(st.ctx, st, agentproto.KindFile, buf[:n]); err != nil {
				s.replyError(st.id, agentproto.CodeFSAborted, fmt.Sprintf("read %s: canceled after %d bytes", req.Path, total))
				return
			}
			total += int64(n)
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			s.replyErr(st.id, fsError("read", req.Path, rerr))
			return
		}
	}
	_ = s.w.enqueue(s.gen, []agentproto.Frame{{Kind: agentproto.KindFile, Stream: st.id}}, nil)
	s.reply(st.id, req.Op, agentproto.ReadResult{BytesRead: total})
}

// spawnProc runs a supervised process and streams it like an exec.
func (s *session) spawnProc(st *stream, req *agentproto.SpawnRequest) {
	if s.srv.Procs == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "spawn is not served by this agent")
		return
	}
	eio := s.streamIO(st)
	status, err := s.srv.Procs.Run(st.ctx, req, eio)
	if err != nil {
		s.replyErr(st.id, err)
		return
	}
	_ = s.send(st.id, status)
}

// procAttach streams a kept process again, like its spawn stream.
func (s *session) procAttach(st *stream, req *agentproto.ProcAttachRequest) {
	if s.srv.Procs == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "proc_attach is not served by this agent")
		return
	}
	eio := s.streamIO(st)
	eio.Attached = func(pid int, dropped int64) {
		_ = s.send(st.id, &agentproto.Started{PID: pid, DroppedBytes: dropped})
	}
	status, err := s.srv.Procs.Attach(st.ctx, req, eio)
	if err != nil {
		s.replyErr(st.id, err)
		return
	}
	_ = s.send(st.id, status)
}

func (s *session) procStop(st *stream, req *agentproto.ProcStopRequest) {
	if s.srv.Procs == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "proc_stop is not served by this agent")
		return
	}
	res, err := s.srv.Procs.Stop(st.ctx, req)
	if err != nil {
		s.replyErr(st.id, err)
		return
	}
	s.reply(st.id, agentproto.TypeProcStop, res)
}

func (s *session) workspace(st *stream, req *agentproto.WorkspaceRequest) {
	if s.srv.Workspace == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "workspace is not served by this agent")
		return
	}
	res, err := s.srv.Workspace.Unpack(st.ctx, req, &queueReader{ctx: st.ctx, q: st.in})
	if err != nil {
		s.replyErr(st.id, err)
		return
	}
	s.reply(st.id, agentproto.TypeWorkspace, res)
}

func (s *session) net(st *stream, req *agentproto.NetRequest) {
	if s.srv.Net == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "network configuration is not served by this agent")
		return
	}
	res, err := s.srv.Net.Configure(st.ctx, req)
	if err != nil {
		var ae *agentproto.Error
		if !errors.As(err, &ae) {
			ae = agentproto.Errorf(agentproto.CodeNetFailed, "%v", err)
		}
		_ = s.send(st.id, ae)
		return
	}
	s.reply(st.id, "net", res)
}

func (s *session) netStats(st *stream, req *agentproto.NetStatsRequest) {
	if s.srv.NetStats == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "network counters are not served by this agent")
		return
	}
	res, err := s.srv.NetStats.Read(st.ctx, req)
	if err != nil {
		s.replyErr(st.id, err)
		return
	}
	s.reply(st.id, agentproto.TypeNetStats, res)
}

func (s *session) reseed(st *stream, req *agentproto.ReseedRequest) {
	if s.srv.Reseed == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "reseed is not served by this agent")
		return
	}
	res, err := s.srv.Reseed(st.ctx, req)
	if err != nil {
		s.replyErr(st.id, err)
		return
	}
	s.reply(st.id, agentproto.TypeReseed, res)
}

func (s *session) shutdown(st *stream) {
	if s.srv.PowerOff == nil {
		s.replyError(st.id, agentproto.CodeUnsupported, "shutdown is not served by this agent")
		return
	}
	// The reply must reach the host before the VM disappears, or the host
	// could not tell a clean power-off from a crash.
	if err := s.sendSync(st.id, &agentproto.Result{Op: "shutdown"}, 2*time.Second); err != nil {
		s.srv.log().Warn("shutdown reply not written", "error", err)
	}
	if err := s.srv.PowerOff(); err != nil {
		s.srv.log().Error("power off failed", "error", err)
	}
}

// chunkQueue holds input chunks for one stream. Flow control bounds it:
// the host never has more than InitialWindow bytes unacknowledged.
type chunkQueue struct {
	mu       sync.Mutex
	chunks   [][]byte
	err      error // set once: io.EOF or why the stream ended
	sig      chan struct{}
	consumed func(n int)
}

func newChunkQueue(consumed func(int)) *chunkQueue {
	return &chunkQueue{sig: make(chan struct{}, 1), consumed: consumed}
}

func (q *chunkQueue) notify() {
	select {
	case q.sig <- struct{}{}:
	default:
	}
}

func (q *chunkQueue) push(p []byte) {
	q.mu.Lock()
	if q.err == nil {
		q.chunks = append(q.chunks, p)
	}
	q.mu.Unlock()
	q.notify()
}

func (q *chunkQueue) close(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
	q.notify()
}

// next returns the next chunk, or the end-of-input error once the queue is
// drained. Taking a chunk returns its credit to the host.
func (q *chunkQueue) next(ctx context.Context) ([]byte, error) {
	for {
		q.mu.Lock()
		if len(q.chunks) > 0 {
			p := q.chunks[0]
			q.chunks[0] = nil
			q.chunks = q.chunks[1:]
			q.mu.Unlock()
			q.consumed(len(p))
			return p, nil
		}
		if q.err != nil {
			err := q.err
			q.mu.Unlock()
			return nil, err
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-q.sig:
		}
	}
}

// queueReader adapts a chunkQueue to io.Reader for file writes.
type queueReader struct {
	ctx  context.Context
	q    *chunkQueue
	rest []byte
}

func (r *queueReader) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		chunk, err := r.q.next(r.ctx)
		if err != nil {
			return 0, err
		}
		r.rest = chunk
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}
