//go:build linux

package agentclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/guest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testPort behaves like the guest's virtio-console port: reads return EOF
// while no host is attached, writes wait for one. It is the only fake
// here; the agent server, executor and filesystem behind it are real.
type testPort struct {
	mu     sync.Mutex
	cond   *sync.Cond
	conn   net.Conn
	closed bool
	// blipUntil: until then every read returns EOF while the host stays
	// attached; blipped counts the reads that did.
	blipUntil time.Time
	blipped   int
}

// blip makes the agent's reads return EOF for d, the host still
// attached: what a guest sees between processing a stale hang-up event
// (a VM restored from a snapshot template) and the host's reconnection.
func (p *testPort) blip(d time.Duration) {
	p.mu.Lock()
	p.blipUntil = time.Now().Add(d)
	c := p.conn
	p.mu.Unlock()
	if c != nil {
		_ = c.SetReadDeadline(time.Now())
	}
}

func newTestPort() *testPort {
	p := &testPort{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *testPort) attach(c net.Conn) {
	p.mu.Lock()
	p.conn = c
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *testPort) current() (net.Conn, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn, p.closed
}

func (p *testPort) Read(b []byte) (int, error) {
	c, closed := p.current()
	if closed {
		return 0, net.ErrClosed
	}
	if c == nil {
		return 0, io.EOF
	}
	p.mu.Lock()
	blipping := time.Now().Before(p.blipUntil)
	if blipping {
		p.blipped++
	}
	p.mu.Unlock()
	if blipping {
		return 0, io.EOF
	}
	_ = c.SetReadDeadline(time.Time{})
	n, err := c.Read(b)
	p.mu.Lock()
	if n == 0 && time.Now().Before(p.blipUntil) {
		p.blipped++
		p.mu.Unlock()
		return 0, io.EOF
	}
	p.mu.Unlock()
	if err != nil {
		p.mu.Lock()
		if p.conn == c {
			p.conn = nil
		}
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return n, net.ErrClosed
		}
		return n, io.EOF
	}
	return n, nil
}

func (p *testPort) Write(b []byte) (int, error) {
	p.mu.Lock()
	for p.conn == nil && !p.closed {
		p.cond.Wait()
	}
	c, closed := p.conn, p.closed
	p.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return c.Write(b)
}

func (p *testPort) close() {
	p.mu.Lock()
	p.closed = true
	c := p.conn
	p.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
	p.cond.Broadcast()
}

// socketPair returns two connected unix stream sockets, buffered like the
// real chardev socket.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	assert.NilError(t, err)
	conv := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "sock")
		c, err := net.FileConn(f)
		assert.NilError(t, err)
		_ = f.Close()
		return c
	}
	return conv(fds[0]), conv(fds[1])
}

type fakeNet struct{ got chan agentproto.NetRequest }

func (f *fakeNet) Configure(_ context.Context, req *agentproto.NetRequest) (*agentproto.NetResult, error) {
	f.got <- *req
	if req.Interface == "bad0" {
		return nil, errors.New("no such interface")
	}
	return &agentproto.NetResult{Interface: "eth0", Address: "10.0.2.15/24"}, nil
}

type agentEnv struct {
	port     *testPort
	root     string
	poweroff chan struct{}
	net      *fakeNet
	reseeds  chan agentproto.ReseedRequest
}

// startAgent runs a real guest server over a testPort with its root in a
// temporary directory.
func startAgent(t testing.TB) *agentEnv {
	t.Helper()
	env := &agentEnv{port: newTestPort(), root: t.TempDir(), poweroff: make(chan struct{}, 1),
		net: &fakeNet{got: make(chan agentproto.NetRequest, 1)}, reseeds: make(chan agentproto.ReseedRequest, 1)}
	exec := &guest.Executor{Waiter: guest.PIDWaiter{}, DrainGrace: 100 * time.Millisecond}
	srv := &guest.Server{
		Port:      env.port,
		Exec:      exec,
		FS:        &guest.FS{Root: env.root},
		Procs:     &guest.Supervisor{Exec: exec},
		Workspace: guest.Workspace{},
		Net:       env.net,
		NetStats:  &guest.NetCounters{Proc: "/proc", Sys: "/sys"},
		PowerOff:  func() error { env.poweroff <- struct{}{}; return nil },
		// The real guest.Reseed would set this host's clock.
		Reseed: func(_ context.Context, req *agentproto.ReseedRequest) (*agentproto.ReseedResult, error) {
			env.reseeds <- *req
			return &agentproto.ReseedResult{SeedBytes: len(req.Seed), ClockSet: req.UnixNano > 0}, nil
		},
		Hello: agentproto.Hello{Version: "test", Arch: "amd64", Root: "initramfs"},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		env.port.close()
		waitfor.Recv(t, done, waitfor.Default, "the fake agent server to stop")
	})
	return env
}

func (e *agentEnv) connect(t testing.TB) *Client {
	t.Helper()
	a, b := socketPair(t)
	e.port.attach(a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, b, Options{})
	assert.NilError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestStaleHangUp: an end of file from the port that the same host
// outlives (a stale hang-up event) does not end its session: the next
// request is answered without a new hello.
func TestStaleHangUp(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"echo", "before"}})
	assert.NilError(t, err)
	assert.Equal(t, string(res.Stdout), "before\n")
	env.port.blip(50 * time.Millisecond)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		env.port.mu.Lock()
		defer env.port.mu.Unlock()
		if env.port.blipped > 1 && time.Now().After(env.port.blipUntil) {
			return poll.Success()
		}
		return poll.Continue("the agent has not read the stale EOFs yet")
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(time.Millisecond))
	res, err = c.Exec(ctx, ExecRequest{Argv: []string{"echo", "after"}})
	assert.NilError(t, err)
	assert.Equal(t, string(res.Stdout), "after\n")
}

func TestHandshake(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	h := c.Hello()
	assert.Equal(t, h.Role, agentproto.RoleAgent)
	assert.Equal(t, h.ProtocolMajor, agentproto.ProtocolMajor)
	assert.Equal(t, h.Version, "test")
	assert.DeepEqual(t, h.Capabilities, agentproto.AllCapabilities())
}

// TestReseed: the seed and the clock reach the agent; a seed the protocol
// refuses never leaves the host.
func TestReseed(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 5)
	res, err := c.Reseed(ctx, agentproto.ReseedRequest{Seed: []byte("0123456789abcdef"), UnixNano: now.UnixNano(), Hostname: "sandbox-1234abcd"})
	assert.NilError(t, err)
	assert.DeepEqual(t, *res, agentproto.ReseedResult{SeedBytes: 16, ClockSet: true})
	got := waitfor.Recv(t, env.reseeds, waitfor.Default, "the agent to receive the reseed")
	assert.Equal(t, string(got.Seed), "0123456789abcdef")
	assert.Equal(t, got.UnixNano, now.UnixNano())
	assert.Equal(t, got.Hostname, "sandbox-1234abcd")

	_, err = c.Reseed(ctx, agentproto.ReseedRequest{})
	assert.ErrorContains(t, err, "seed must hold 1 to 512 bytes")
	_, err = c.Reseed(ctx, agentproto.ReseedRequest{Seed: []byte("x"), Hostname: "a b;rm"})
	assert.ErrorContains(t, err, "not a host name")
}

func TestExecOverTheProtocol(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()

	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"echo", "hi"}})
	assert.NilError(t, err)
	assert.Equal(t, string(res.Stdout), "hi\n")
	assert.Equal(t, res.ExitCode, 0)
	assert.Assert(t, res.PID > 0)

	res, err = c.Exec(ctx, ExecRequest{Argv: []string{"no-such-program"}})
	assert.NilError(t, err)
	assert.Equal(t, res.ExitCode, 127)

	res, err = c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "sleep 100"}, Timeout: 200 * time.Millisecond})
	assert.NilError(t, err)
	assert.Assert(t, res.TimedOut)
	assert.Equal(t, res.ExitCode, 137)

	// 3 MiB through cat: stdin and stdout both outgrow one window.
	in := bytes.Repeat([]byte("stdin-data-"), 300000)
	res, err = c.Exec(ctx, ExecRequest{Argv: []string{"cat"}, Stdin: bytes.NewReader(in), MaxOutputBytes: 4 << 20})
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(res.Stdout, in), "got %d bytes", len(res.Stdout))

	res, err = c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "head -c 2000000 /dev/zero"}})
	assert.NilError(t, err)
	assert.Equal(t, len(res.Stdout), agentproto.DefaultMaxOutput)
	assert.Assert(t, res.StdoutTruncated)
}

func TestConcurrentOperations(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%3 == 0 {
				p := fmt.Sprintf("/f%d", i)
				data := bytes.Repeat([]byte{byte(i)}, 200000+i)
				_, err := c.WriteFile(ctx, &agentproto.FSRequest{Path: p}, bytes.NewReader(data))
				if !assert.Check(t, err) {
					return
				}
				var buf bytes.Buffer
				_, _, err = c.ReadFileTo(ctx, p, &buf)
				assert.Check(t, err)
				assert.Check(t, bytes.Equal(buf.Bytes(), data))
				return
			}
			res, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo $0", strconv.Itoa(i)}})
			if assert.Check(t, err) {
				assert.Check(t, string(res.Stdout) == strconv.Itoa(i)+"\n", string(res.Stdout))
			}
		}()
	}
	waitfor.Group(t, &wg, waitfor.Default, "the concurrent execs")
}

func TestStreamedFileRoundTrip(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	data := make([]byte, 10<<20)
	for i := range data {
		data[i] = byte(i * 7 / 13)
	}
	wres, err := c.WriteFile(ctx, &agentproto.FSRequest{Path: "/big/file.bin", Parents: true, Mode: "0600"}, bytes.NewReader(data))
	assert.NilError(t, err)
	assert.Equal(t, wres.BytesWritten, int64(len(data)))
	assert.Equal(t, wres.Path, "/big/file.bin")

	meta, r, err := c.ReadFile(ctx, "/big/file.bin")
	assert.NilError(t, err)
	assert.Equal(t, meta.Size, int64(len(data)))
	assert.Equal(t, meta.Mode, "0600")
	// A slow reader with a small buffer: flow control must hold the agent
	// back rather than buffer the file here.
	h := sha256.New()
	buf := make([]byte, 3000)
	for {
		n, err := r.Read(buf)
		h.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		assert.NilError(t, err)
	}
	assert.NilError(t, r.Close())
	want := sha256.Sum256(data)
	assert.Equal(t, fmt.Sprintf("%x", h.Sum(nil)), fmt.Sprintf("%x", want[:]))
}

func TestFSErrorsCrossTheWire(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()

	_, err := c.WriteFile(ctx, &agentproto.FSRequest{Path: "/a/b/c.txt"}, strings.NewReader("x"))
	var ae *agentproto.Error
	assert.Assert(t, errors.As(err, &ae), "%v", err)
	assert.Equal(t, ae.Code, agentproto.CodeFSNotFound)
	assert.Assert(t, ae.ParentMissing)

	_, _, err = c.ReadFile(ctx, "/missing")
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeFSNotFound)

	_, err = c.Ls(ctx, "/nope")
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeFSNotFound)

	// A source that fails midway aborts the write; nothing is left behind.
	_, err = c.WriteFile(ctx, &agentproto.FSRequest{Path: "/partial.txt"}, io.MultiReader(bytes.NewReader(make([]byte, 300000)), failingReader{}))
	assert.Assert(t, errors.As(err, &ae), "%v", err)
	assert.Equal(t, ae.Code, agentproto.CodeFSAborted)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		des, _ := os.ReadDir(env.root)
		if len(des) == 0 {
			return poll.Success()
		}
		return poll.Continue("files left: %v", des)
	})

	// Typed helpers for the remaining ops.
	_, err = c.Mkdir(ctx, "/d/e", "", true)
	assert.NilError(t, err)
	_, err = c.WriteFile(ctx, &agentproto.FSRequest{Path: "/d/e/x.txt"}, strings.NewReader("needle here\n"))
	assert.NilError(t, err)
	st, err := c.Stat(ctx, "/d/e/x.txt")
	assert.NilError(t, err)
	assert.Equal(t, st.Size, int64(12))
	g, err := c.Grep(ctx, &agentproto.FSRequest{Path: "/d", Pattern: "needle"})
	assert.NilError(t, err)
	assert.Equal(t, len(g.Matches), 1)
	s, err := c.Sed(ctx, &agentproto.FSRequest{Path: "/d", Pattern: "needle", Replacement: ptr("pin")})
	assert.NilError(t, err)
	assert.Equal(t, s.TotalReplacements, 1)
	ch, err := c.Chmod(ctx, &agentproto.FSRequest{Path: "/d", Mode: "0700", Recursive: ptr(true)})
	assert.NilError(t, err)
	assert.Equal(t, ch.Updated, int64(3))
	_, err = c.Mv(ctx, "/d/e/x.txt", "/d/y.txt", false)
	assert.NilError(t, err)
	ls, err := c.Ls(ctx, "/d")
	assert.NilError(t, err)
	assert.Equal(t, len(ls.Entries), 2)
	_, err = c.Rm(ctx, "/d", true)
	assert.NilError(t, err)
	err = c.FS(ctx, &agentproto.FSRequest{Op: agentproto.OpWrite, Path: "/x"}, nil)
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeFSInvalid)
}

func ptr[T any](v T) *T { return &v }

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestLargeResultIsSplitIntoParts(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	line := strings.Repeat("match ", 100) + "\n"
	assert.NilError(t, os.WriteFile(filepath.Join(env.root, "many.txt"), []byte(strings.Repeat(line, 5000)), 0o644))
	g, err := c.Grep(context.Background(), &agentproto.FSRequest{Path: "/many.txt", Pattern: "match"})
	assert.NilError(t, err)
	assert.Equal(t, len(g.Matches), 5000) // about 3 MiB of JSON
}

func TestCancelKillsTheExec(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	pidFile := filepath.Join(env.root, "pid")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 100"}})
		errc <- err
	}()
	var pid int
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return poll.Continue("no pid yet")
		}
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return poll.Success()
	})
	cancel()
	assert.ErrorIs(t, waitfor.Recv(t, errc, waitfor.Default, "the cancelled exec to return"), context.Canceled)
	poll.WaitOn(t, processGone(pid))
	// The connection stays usable.
	res, err := c.Exec(context.Background(), ExecRequest{Argv: []string{"true"}})
	assert.NilError(t, err)
	assert.Equal(t, res.ExitCode, 0)
}

func processGone(pid int) func(poll.LogT) poll.Result {
	return func(poll.LogT) poll.Result {
		st, err := guest.ReadProcStat(pid)
		if err != nil || st.State == 'Z' {
			return poll.Success()
		}
		return poll.Continue("process %d still %c", pid, st.State)
	}
}

// TestReconnect: a host that goes away mid-exec has its processes killed;
// the next connection gets a fresh hello and works, even when the old
// host left half a frame behind.
func TestReconnect(t *testing.T) {
	env := startAgent(t)
	c1 := env.connect(t)
	pidFile := filepath.Join(env.root, "pid")
	errc := make(chan error, 1)
	go func() {
		_, err := c1.Exec(context.Background(), ExecRequest{Argv: []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 100"}})
		errc <- err
	}()
	var pid int
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return poll.Continue("no pid yet")
		}
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return poll.Success()
	})
	// Half a frame, then the host vanishes.
	half, _ := agentproto.AppendFrame(nil, agentproto.Frame{Kind: agentproto.KindControl, Stream: 99, Payload: []byte(`{"type":"exec","argv":["true"]}`)})
	assert.NilError(t, c1.write(agentproto.Frame{Kind: agentproto.KindStdin, Stream: 1, Payload: []byte("x")}))
	c1.wmu.Lock()
	_, _ = c1.conn.Write(half[:12])
	c1.wmu.Unlock()
	assert.NilError(t, c1.Close())
	var ae *agentproto.Error
	assert.Assert(t, errors.As(waitfor.Recv(t, errc, waitfor.Default, "the call to fail once the connection closed"), &ae))
	assert.Equal(t, ae.Code, agentproto.CodeDisconnected)
	poll.WaitOn(t, processGone(pid))

	c2 := env.connect(t)
	res, err := c2.Exec(context.Background(), ExecRequest{Argv: []string{"echo", "again"}})
	assert.NilError(t, err)
	assert.Equal(t, string(res.Stdout), "again\n")
}

// TestHelloMidSession: QEMU's chardev joins a new host connection onto the
// same byte stream, with no end of file in between, so a new Magic and
// hello can follow a session's frames. The agent starts a new session for
// it instead of reading the Magic as a frame header and wedging.
func TestHelloMidSession(t *testing.T) {
	env := startAgent(t)
	a, b := socketPair(t)
	env.port.attach(a)
	assert.NilError(t, b.SetDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(b)
	hello := func(nonce string) {
		t.Helper()
		p, err := json.Marshal(agentproto.Hello{Role: agentproto.RoleHost, ProtocolMajor: agentproto.ProtocolMajor,
			ProtocolMinor: agentproto.ProtocolMinor, Nonce: nonce, Version: "test"})
		assert.NilError(t, err)
		raw, err := agentproto.AppendFrame([]byte(agentproto.Magic), agentproto.Frame{Kind: agentproto.KindHello, Payload: p})
		assert.NilError(t, err)
		_, err = b.Write(raw)
		assert.NilError(t, err)
		assert.NilError(t, agentproto.SkipToMagic(br))
		f, err := agentproto.ReadFrameBuffered(br)
		assert.NilError(t, err)
		assert.Equal(t, f.Kind, agentproto.KindHello)
		h, err := agentproto.DecodeHello(f.Payload)
		assert.NilError(t, err)
		assert.Equal(t, h.Nonce, nonce, "the agent answers this host's hello")
	}
	hello("first-host")
	hello("second-host")
}

// TestHelloRepeated: the guest's console driver drops what arrives before
// the agent opens its port, so a hello sent too early is lost. The client
// repeats it until the agent answers.
func TestHelloRepeated(t *testing.T) {
	a, b := socketPair(t)
	agentDone := make(chan error, 1)
	go func() {
		// A fake agent that drops the first hello, as the driver does
		// before the port is open, and answers the next one.
		br := bufio.NewReader(a)
		for i := 0; ; i++ {
			if err := agentproto.SkipToMagic(br); err != nil {
				agentDone <- err
				return
			}
			f, err := agentproto.ReadFrameBuffered(br)
			if err != nil {
				agentDone <- err
				return
			}
			if i == 0 {
				continue
			}
			h, err := agentproto.DecodeHello(f.Payload)
			if err != nil {
				agentDone <- err
				return
			}
			p, _ := json.Marshal(agentproto.Hello{Role: agentproto.RoleAgent, ProtocolMajor: agentproto.ProtocolMajor,
				ProtocolMinor: agentproto.ProtocolMinor, Nonce: h.Nonce, Version: "fake"})
			raw, _ := agentproto.AppendFrame([]byte(agentproto.Magic), agentproto.Frame{Kind: agentproto.KindHello, Payload: p})
			_, err = a.Write(raw)
			agentDone <- err
			return
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, b, Options{})
	assert.NilError(t, err)
	defer c.Close()
	assert.Equal(t, c.Hello().Version, "fake")
	assert.NilError(t, waitfor.Recv(t, agentDone, waitfor.Default, "the fake agent to finish its handshake"))
}

// TestDuplicateHelloAnswer: the agent answers every copy of a repeated
// hello; answers that arrive after the handshake are skipped and the
// connection keeps working.
func TestDuplicateHelloAnswer(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	p, err := json.Marshal(agentproto.Hello{Role: agentproto.RoleHost, ProtocolMajor: agentproto.ProtocolMajor,
		ProtocolMinor: agentproto.ProtocolMinor, Nonce: "again", Version: "test"})
	assert.NilError(t, err)
	raw, err := agentproto.AppendFrame([]byte(agentproto.Magic), agentproto.Frame{Kind: agentproto.KindHello, Payload: p})
	assert.NilError(t, err)
	c.wmu.Lock()
	_, err = c.conn.Write(raw)
	c.wmu.Unlock()
	assert.NilError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"echo", "still"}})
	assert.NilError(t, err)
	assert.Equal(t, string(res.Stdout), "still\n")
}

func TestNetAndShutdown(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	res, err := c.ConfigureNetwork(ctx, agentproto.NetRequest{DNS: []string{"10.0.2.3"}})
	assert.NilError(t, err)
	assert.Equal(t, res.Address, "10.0.2.15/24")
	assert.DeepEqual(t, waitfor.Recv(t, env.net.got, waitfor.Default, "the agent to receive the network request"), agentproto.NetRequest{DNS: []string{"10.0.2.3"}})

	_, err = c.ConfigureNetwork(ctx, agentproto.NetRequest{Interface: "bad0"})
	var ae *agentproto.Error
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeNetFailed)
	waitfor.Recv(t, env.net.got, waitfor.Default, "the agent to receive the failing network request")

	assert.NilError(t, c.Shutdown(ctx))
	select {
	case <-env.poweroff:
	case <-time.After(10 * time.Second):
		t.Fatal("power off not called")
	}
}

// net_stats over the protocol, served by the real counters reader on
// this host's own procfs and sysfs.
func TestNetStats(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	res, err := c.NetStats(ctx, "lo")
	assert.NilError(t, err)
	assert.Equal(t, res.Interface, "lo")

	_, err = c.NetStats(ctx, "../../etc")
	var ae *agentproto.Error
	assert.Assert(t, errors.As(err, &ae), "%v", err)
	assert.Equal(t, ae.Code, agentproto.CodeProtocol)
}

// fakeAgent answers the handshake with a chosen hello, to test what the
// client does with agents of other versions.
func fakeAgent(t *testing.T, conn net.Conn, h agentproto.Hello, junk []byte) {
	t.Helper()
	go func() {
		br := bufio.NewReader(conn)
		if agentproto.SkipToMagic(br) != nil {
			return
		}
		f, err := agentproto.ReadFrame(br)
		if err != nil {
			return
		}
		mine, err := agentproto.DecodeHello(f.Payload)
		if err != nil {
			return
		}
		h.Nonce = mine.Nonce
		p, _ := json.Marshal(h)
		out := append(append([]byte{}, junk...), agentproto.Magic...)
		out, _ = agentproto.AppendFrame(out, agentproto.Frame{Kind: agentproto.KindHello, Payload: p})
		_, _ = conn.Write(out)
		_, _ = io.Copy(io.Discard, conn)
	}()
}

func TestVersionAndCapabilities(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	a, b := socketPair(t)
	fakeAgent(t, a, agentproto.Hello{Role: agentproto.RoleAgent, ProtocolMajor: 2, ProtocolMinor: 0}, nil)
	_, err := New(ctx, b, Options{})
	var ae *agentproto.Error
	assert.Assert(t, errors.As(err, &ae), "%v", err)
	assert.Equal(t, ae.Code, agentproto.CodeProtocolMismatch)
	_ = a.Close()

	// A newer minor with fewer capabilities: connects, and only the
	// missing operations fail, without reaching the agent.
	a, b = socketPair(t)
	stale := append(make([]byte, 0, 40), bytes.Repeat([]byte{0x00, 0xa5, 'i'}, 10)...)
	fakeAgent(t, a, agentproto.Hello{Role: agentproto.RoleAgent, ProtocolMajor: 1, ProtocolMinor: 9,
		Capabilities: []string{agentproto.CapExec, "teleport"}}, stale)
	c, err := New(ctx, b, Options{})
	assert.NilError(t, err)
	_, err = c.Sed(ctx, &agentproto.FSRequest{Path: "/", Pattern: "a", Replacement: ptr("b")})
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeFSUnsupported)
	err = c.Shutdown(ctx)
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeUnsupported)
	_, err = c.NetStats(ctx, "")
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeUnsupported)
	assert.NilError(t, c.Close())
	_ = a.Close()

	// No hello at all: the handshake ends with ctx.
	a, b = socketPair(t)
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	_, err = New(short, b, Options{})
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeDisconnected)
	_ = a.Close()
}

type bogus struct{}

func (*bogus) MessageType() string { return "frobnicate" }

func TestUnknownRequestIsRefused(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	st, err := c.open(&bogus{}, nil, nil)
	assert.NilError(t, err)
	_, err = st.wait(context.Background())
	var ae *agentproto.Error
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeUnsupported)
}

func TestDialRetriesUntilTheSocketExists(t *testing.T) {
	env := startAgent(t)
	sock := filepath.Join(t.TempDir(), "exec.sock")
	go func() {
		time.Sleep(50 * time.Millisecond)
		l, err := net.Listen("unix", sock)
		if err != nil {
			return
		}
		defer l.Close()
		conn, err := l.Accept()
		if err != nil {
			return
		}
		env.port.attach(conn)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock, Options{})
	assert.NilError(t, err)
	defer c.Close()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}})
	assert.NilError(t, err)
	assert.Equal(t, res.ExitCode, 0)

	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	_, err = Dial(short, filepath.Join(t.TempDir(), "never.sock"), Options{})
	var ae *agentproto.Error
	assert.Assert(t, errors.As(err, &ae))
	assert.Equal(t, ae.Code, agentproto.CodeDisconnected)
}

// frameSpy is the host's end of the connection, parsing what the client
// writes into frames on the side.
type frameSpy struct {
	net.Conn
	pw *io.PipeWriter
}

func (s *frameSpy) Write(b []byte) (int, error) {
	_, _ = s.pw.Write(b)
	return s.Conn.Write(b)
}

// TestFileFrameSizes: a file write leaves in FileChunkSize frames, and a
// streamed read returns its credit in batches, not a grant per Read (each
// frame is work for an emulated guest); the bytes still round-trip
// through the real agent, read through a small buffer.
func TestFileFrameSizes(t *testing.T) {
	env := startAgent(t)
	a, b := socketPair(t)
	env.port.attach(a)
	pr, pw := io.Pipe()
	type seen struct{ fileFrames, bigFileFrames, windows int }
	got := make(chan seen, 1)
	go func() {
		var s seen
		br := bufio.NewReader(pr)
		_ = agentproto.SkipToMagic(br)
		for {
			f, err := agentproto.ReadFrame(br)
			if err != nil {
				got <- s
				return
			}
			switch {
			case f.Kind == agentproto.KindFile && len(f.Payload) > 0:
				s.fileFrames++
				if len(f.Payload) == agentproto.FileChunkSize {
					s.bigFileFrames++
				}
			case f.Kind == agentproto.KindWindow:
				s.windows++
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := New(ctx, &frameSpy{Conn: b, pw: pw}, Options{})
	assert.NilError(t, err)

	const size = 4<<20 + 100
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 11 / 7)
	}
	// iotest.OneByteReader would be slow; 64 KiB reads are what the
	// contract's gRPC stream yields.
	_, err = c.WriteFile(ctx, &agentproto.FSRequest{Path: "/f.bin"}, &chunkedReader{r: bytes.NewReader(data), n: 64 << 10})
	assert.NilError(t, err)
	meta, r, err := c.ReadFile(ctx, "/f.bin")
	assert.NilError(t, err)
	assert.Equal(t, meta.Size, int64(size))
	var back bytes.Buffer
	buf := make([]byte, 5000)
	for {
		n, err := r.Read(buf)
		back.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		assert.NilError(t, err)
	}
	assert.NilError(t, r.Close())
	assert.Assert(t, bytes.Equal(back.Bytes(), data))
	assert.NilError(t, c.Close())
	_ = pw.Close()
	s := waitfor.Recv(t, got, waitfor.Default, "the frame parser")
	assert.Equal(t, s.fileFrames, size/agentproto.FileChunkSize+1, "%+v", s)
	assert.Equal(t, s.bigFileFrames, size/agentproto.FileChunkSize, "%+v", s)
	// One grant per Read would be about size/5000 = 840 frames.
	assert.Assert(t, s.windows <= size/grantBatch+2, "%+v", s)
}

type chunkedReader struct {
	r io.Reader
	n int
}

func (c *chunkedReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }
