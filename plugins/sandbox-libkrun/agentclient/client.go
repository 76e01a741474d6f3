// Package agentclient is the host side of the guest-agent protocol
// (agentproto): it connects to the VM's "iii.exec" port (a unix socket that
// QEMU serves), checks the agent's hello, and runs many concurrent execs and
// filesystem operations over the one connection.
package agentclient

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/internal/version"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Options tunes a Client.
type Options struct {
	Log hclog.Logger
	// DialRetry is how often Dial retries while the socket does not accept
	// yet (QEMU creates it a few milliseconds after it starts).
	DialRetry time.Duration
}

// Client is one connection to a guest agent. It is safe for concurrent use.
type Client struct {
	conn  io.ReadWriteCloser
	log   hclog.Logger
	hello *agentproto.Hello

	wmu sync.Mutex // one writer at a time, whole frames only

	mu      sync.Mutex
	streams map[uint32]*stream
	nextID  uint32
	err     error // why the connection ended
	done    chan struct{}
	readers sync.WaitGroup
}

// Dial connects to the agent's unix socket, retrying until the socket
// accepts or ctx ends, and performs the handshake (which waits for the
// guest to boot).
func Dial(ctx context.Context, socketPath string, opts Options) (*Client, error) {
	retry := opts.DialRetry
	if retry == 0 {
		retry = 5 * time.Millisecond
	}
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", socketPath)
		if err == nil {
			return New(ctx, conn, opts)
		}
		if ctx.Err() != nil {
			return nil, &agentproto.Error{Code: agentproto.CodeDisconnected,
				Message: fmt.Sprintf("connect to the guest agent at %s: %v (last error: %v)", socketPath, ctx.Err(), err)}
		}
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, &agentproto.Error{Code: agentproto.CodeDisconnected,
				Message: fmt.Sprintf("connect to the guest agent at %s: %v", socketPath, err)}
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// New performs the handshake on an open connection and starts serving it.
// It owns conn from then on. It waits for the agent's hello until ctx ends.
func New(ctx context.Context, conn io.ReadWriteCloser, opts Options) (*Client, error) {
	log := opts.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	c := &Client{conn: conn, log: log, streams: make(map[uint32]*stream), done: make(chan struct{})}
	// A blocked read cannot see ctx, so ctx ending closes the connection.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	br := bufio.NewReaderSize(conn, 64<<10)
	h, err := c.handshake(br)
	if !stop() {
		// ctx ended and closed the connection under the handshake.
		_ = conn.Close()
		return nil, &agentproto.Error{Code: agentproto.CodeDisconnected, Message: fmt.Sprintf("no hello from the guest agent: %v", ctx.Err())}
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if err := agentproto.CheckCompatible(h); err != nil {
		_ = conn.Close()
		return nil, err
	}
	c.hello = h
	c.readers.Add(1)
	go c.readLoop(br)
	return c, nil
}

func (c *Client) handshake(br *bufio.Reader) (*agentproto.Hello, error) {
	var nonce [12]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	mine := agentproto.Hello{
		Role: agentproto.RoleHost, ProtocolMajor: agentproto.ProtocolMajor, ProtocolMinor: agentproto.ProtocolMinor,
		Nonce: hex.EncodeToString(nonce[:]), Version: version.Version,
	}
	p, err := json.Marshal(mine)
	if err != nil {
		return nil, err
	}
	buf, err := agentproto.AppendFrame([]byte(agentproto.Magic), agentproto.Frame{Kind: agentproto.KindHello, Payload: p})
	if err != nil {
		return nil, err
	}
	if _, err := c.conn.Write(buf); err != nil {
		return nil, &agentproto.Error{Code: agentproto.CodeDisconnected, Message: fmt.Sprintf("send hello: %v", err)}
	}
	// The guest's virtio console driver discards what arrives before the
	// agent opens its port, and under a slow boot the hello can land just
	// before that: say it again until the agent answers. Every copy
	// precedes any later frame on the stream, so the agent (which starts a
	// new session per hello) has seen them all before the first request.
	stopResend, resendDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(resendDone)
		t := time.NewTicker(helloResend)
		defer t.Stop()
		for {
			select {
			case <-stopResend:
				return
			case <-t.C:
				if _, err := c.conn.Write(buf); err != nil {
					return
				}
			}
		}
	}()
	defer func() {
		close(stopResend)
		<-resendDone
	}()
	for {
		// Bytes before the magic are the rest of a frame the agent was
		// writing to a previous connection.
		if err := agentproto.SkipToMagic(br); err != nil {
			return nil, handshakeErr(err)
		}
		f, err := agentproto.ReadFrameBuffered(br)
		if err != nil {
			if errors.Is(err, agentproto.ErrFrameTooLarge) {
				continue
			}
			return nil, handshakeErr(err)
		}
		if f.Kind != agentproto.KindHello {
			continue
		}
		h, err := agentproto.DecodeHello(f.Payload)
		if err != nil {
			return nil, &agentproto.Error{Code: agentproto.CodeProtocol, Message: err.Error()}
		}
		if h.Role == agentproto.RoleAgent && h.Nonce == mine.Nonce {
			return h, nil
		}
	}
}

// helloResend is how often the handshake repeats its hello while the agent
// has not answered.
const helloResend = time.Second

// skipHello consumes a Magic-prefixed hello frame.
func skipHello(br *bufio.Reader) error {
	if err := agentproto.SkipToMagic(br); err != nil {
		return err
	}
	f, err := agentproto.ReadFrameBuffered(br)
	if err != nil {
		return err
	}
	if f.Kind != agentproto.KindHello {
		return fmt.Errorf("agentproto: a %v frame follows the hello magic", f.Kind)
	}
	return nil
}

func handshakeErr(err error) error {
	if errors.Is(err, agentproto.ErrNoMagic) {
		return &agentproto.Error{Code: agentproto.CodeProtocol, Message: "the peer does not speak the guest-agent protocol"}
	}
	return &agentproto.Error{Code: agentproto.CodeDisconnected, Message: fmt.Sprintf("waiting for the agent's hello: %v", err)}
}

// Hello returns what the agent announced.
func (c *Client) Hello() agentproto.Hello { return *c.hello }

// Done is closed when the connection has ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended, or nil while it is up.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection; operations in flight fail with
// AGENT_DISCONNECTED (and the agent kills their processes).
func (c *Client) Close() error {
	err := c.conn.Close()
	c.readers.Wait()
	return err
}

func (c *Client) readLoop(br *bufio.Reader) {
	defer c.readers.Done()
	var asm agentproto.Assembler
	var err error
	for {
		if agentproto.AtMagic(br) {
			// The agent's answer to a repeated hello of the handshake.
			if err = skipHello(br); err != nil {
				break
			}
			continue
		}
		var f agentproto.Frame
		f, err = agentproto.ReadFrameBuffered(br)
		if err != nil {
			break
		}
		switch {
		case f.Kind == agentproto.KindControl || f.Kind == agentproto.KindControlPart:
			var msg []byte
			var done bool
			msg, done, err = asm.Add(f)
			if err != nil {
				break
			}
			if done {
				m, derr := agentproto.DecodeMessage(msg)
				if derr != nil {
					c.log.Warn("undecodable message from the agent", "stream", f.Stream, "error", derr)
					if st := c.lookup(f.Stream); st != nil {
						st.finish(nil, &agentproto.Error{Code: agentproto.CodeProtocol, Message: derr.Error()})
					}
					continue
				}
				if st := c.lookup(f.Stream); st != nil {
					st.control(m)
				}
			}
		case f.Kind == agentproto.KindWindow:
			n, werr := agentproto.ParseWindow(f.Payload)
			if werr != nil {
				err = werr
				break
			}
			if st := c.lookup(f.Stream); st != nil {
				st.send.Grant(int(n))
			}
		case f.Kind.IsData():
			if st := c.lookup(f.Stream); st != nil {
				st.data(f.Kind, f.Payload)
			}
		}
		if err != nil {
			break
		}
	}
	_ = c.conn.Close()
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = &agentproto.Error{Code: agentproto.CodeDisconnected, Message: "the guest agent connection closed"}
	} else {
		err = &agentproto.Error{Code: agentproto.CodeDisconnected, Message: fmt.Sprintf("the guest agent connection failed: %v", err)}
	}
	c.mu.Lock()
	c.err = err
	streams := c.streams
	c.streams = map[uint32]*stream{}
	c.mu.Unlock()
	for _, st := range streams {
		st.finish(nil, err)
	}
	close(c.done)
}

func (c *Client) lookup(id uint32) *stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[id]
}

func (c *Client) write(frames ...agentproto.Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(frames...)
}

func (c *Client) writeLocked(frames ...agentproto.Frame) error {
	var buf []byte
	for _, f := range frames {
		var err error
		if buf, err = agentproto.AppendFrame(buf, f); err != nil {
			return err
		}
	}
	if _, err := c.conn.Write(buf); err != nil {
		return &agentproto.Error{Code: agentproto.CodeDisconnected, Message: fmt.Sprintf("write to the guest agent: %v", err)}
	}
	return nil
}

// writeData writes one data frame without copying p behind the header:
// one writev on the socket, whole, under the write lock.
func (c *Client) writeData(kind agentproto.Kind, id uint32, p []byte) error {
	if len(p) > agentproto.MaxPayload {
		return agentproto.ErrFrameTooLarge
	}
	var h [agentproto.HeaderSize]byte
	bufs := net.Buffers{agentproto.AppendHeader(h[:0], kind, id, len(p)), p}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := bufs.WriteTo(c.conn); err != nil {
		return &agentproto.Error{Code: agentproto.CodeDisconnected, Message: fmt.Sprintf("write to the guest agent: %v", err)}
	}
	return nil
}

func (c *Client) writeControl(id uint32, m agentproto.Message) error {
	frames, err := agentproto.EncodeControl(id, m)
	if err != nil {
		return err
	}
	return c.write(frames...)
}

// need fails an operation the agent did not announce.
func (c *Client) need(capability string, fsOp bool) error {
	if c.hello.Has(capability) {
		return nil
	}
	code := agentproto.CodeUnsupported
	if fsOp {
		code = agentproto.CodeFSUnsupported
	}
	return agentproto.Errorf(code, "the guest agent (version %s) does not support %s; rebuild the VM image's initramfs", c.hello.Version, capability)
}

// stream is one operation in flight. The read loop calls control and data;
// they must not block.
type stream struct {
	c    *Client
	id   uint32
	send *agentproto.SendWindow
	recv agentproto.RecvWindow

	onControl func(m agentproto.Message) // non-terminal messages
	onData    func(st *stream, kind agentproto.Kind, p []byte)

	once     sync.Once
	done     chan struct{}
	terminal agentproto.Message
	err      error
}

var errStreamEnded = errors.New("agentclient: operation ended")

// open registers a new stream and sends its request.
func (c *Client) open(req agentproto.Message, onControl func(agentproto.Message), onData func(*stream, agentproto.Kind, []byte)) (*stream, error) {
	// The agent requires stream ids to grow, so the id is taken and the
	// request written under the write lock: requests leave in id order.
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	st := &stream{c: c, id: c.nextID, send: agentproto.NewSendWindow(), onControl: onControl, onData: onData, done: make(chan struct{})}
	c.streams[st.id] = st
	c.mu.Unlock()
	frames, err := agentproto.EncodeControl(st.id, req)
	if err == nil {
		err = c.writeLocked(frames...)
	}
	if err != nil {
		c.forget(st)
		return nil, err
	}
	return st, nil
}

func (c *Client) forget(st *stream) {
	c.mu.Lock()
	delete(c.streams, st.id)
	c.mu.Unlock()
	st.send.Close(errStreamEnded)
}

func (st *stream) control(m agentproto.Message) {
	switch m := m.(type) {
	case *agentproto.ExitStatus, *agentproto.Result:
		st.finish(m, nil)
	case *agentproto.Error:
		st.finish(nil, m)
	default:
		if st.onControl != nil {
			st.onControl(m)
		}
	}
}

func (st *stream) data(kind agentproto.Kind, p []byte) {
	if len(p) > 0 {
		if err := st.recv.Received(len(p)); err != nil {
			st.finish(nil, &agentproto.Error{Code: agentproto.CodeProtocol, Message: err.Error()})
			_ = st.c.writeControl(st.id, &agentproto.Cancel{})
			return
		}
	}
	if st.onData != nil {
		st.onData(st, kind, p)
	}
}

// grant returns credit for n consumed bytes.
func (st *stream) grant(n int) {
	if n <= 0 {
		return
	}
	st.recv.Consumed(n)
	_ = st.c.write(agentproto.Frame{Kind: agentproto.KindWindow, Stream: st.id, Payload: agentproto.WindowPayload(uint32(n))})
}

func (st *stream) finish(terminal agentproto.Message, err error) {
	st.once.Do(func() {
		st.terminal, st.err = terminal, err
		st.c.forget(st)
		close(st.done)
	})
}

// wait waits for the terminal message. When ctx ends first, the agent is
// told to cancel and ctx's error is returned at once; the agent still
// kills what the operation started.
func (st *stream) wait(ctx context.Context) (agentproto.Message, error) {
	select {
	case <-st.done:
		return st.terminal, st.err
	case <-ctx.Done():
		st.cancel()
		return nil, ctx.Err()
	}
}

func (st *stream) cancel() {
	st.abort(&agentproto.Error{Code: agentproto.CodeCanceled, Message: "canceled by the host"})
}

// abort tells the agent to stop the operation and ends the stream here
// with err.
func (st *stream) abort(err error) {
	select {
	case <-st.done:
		return
	default:
	}
	_ = st.c.writeControl(st.id, &agentproto.Cancel{})
	st.finish(nil, err)
}

// sendData streams r as data frames of kind, then the empty frame that
// ends them. It stops early when the stream ends. A file's bytes go in
// frames of FileChunkSize, each filled before it leaves (the source, a
// gRPC stream, yields 64 KiB at a time); a process's input goes as soon as
// it is read.
func (st *stream) sendData(ctx context.Context, kind agentproto.Kind, r io.Reader) (int64, error) {
	var total int64
	read := r.Read
	buf := make([]byte, agentproto.ChunkSize)
	if kind == agentproto.KindFile {
		buf = make([]byte, agentproto.FileChunkSize)
		read = func(p []byte) (int, error) { return fill(r, p) }
	}
	for {
		n, rerr := read(buf)
		p := buf[:n]
		for len(p) > 0 {
			k, err := st.send.Acquire(ctx, len(p))
			if err != nil {
				return total, err
			}
			if err := st.c.writeData(kind, st.id, p[:k]); err != nil {
				return total, err
			}
			p = p[k:]
			total += int64(k)
		}
		if errors.Is(rerr, io.EOF) {
			return total, st.c.write(agentproto.Frame{Kind: kind, Stream: st.id})
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// fill reads into p until it is full or r fails, and returns r's error as
// it is (io.EOF included), unlike io.ReadFull, which would turn a source's
// own io.ErrUnexpectedEOF into a short but complete-looking file.
func fill(r io.Reader, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := r.Read(p[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
