package sdk

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestIsHandshakeLine(t *testing.T) {
	tests := []struct {
		line string
		want bool
	}{
		{"1|1|unix|/tmp/plugin123|grpc|\n", true},
		{"1|1|unix|/tmp/plugin123|grpc|MIIBcert\n", true},
		{"1|1|tcp|127.0.0.1:10000|grpc|cert|true\n", true},
		{"1|2|unix|/tmp/p|grpc|\r\n", true},
		{"1|1|unix|/tmp/p|netrpc|\n", false},
		{"2|1|unix|/tmp/p|grpc|\n", false},
		{"1|x|unix|/tmp/p|grpc|\n", false},
		{"1|1|udp|/tmp/p|grpc|\n", false},
		{"1|1|unix||grpc|\n", false},
		{"1|1|unix|/tmp/p|grpc\n", false},
		{"1|1|unix|/tmp/p|grpc|c|maybe\n", false},
		{"1|1|unix|/tmp/p|grpc|c|true|extra\n", false},
		{"hello world\n", false},
		{"", false},
	}
	for _, tc := range tests {
		t.Run(strings.TrimSpace(tc.line), func(t *testing.T) {
			assert.Equal(t, isHandshakeLine(tc.line), tc.want)
		})
	}
}

func FuzzIsHandshakeLine(f *testing.F) {
	f.Add("1|1|unix|/tmp/plugin123|grpc|\n")
	f.Add("1|1|tcp|127.0.0.1:1|grpc|c|true")
	f.Add("||||||")
	f.Fuzz(func(t *testing.T, line string) {
		if !isHandshakeLine(line) {
			return
		}
		parts := strings.Split(strings.TrimRight(line, "\r\n"), "|")
		if parts[0] != "1" || parts[4] != "grpc" || parts[3] == "" {
			t.Fatalf("accepted %q", line)
		}
	})
}

func TestParseFD(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"3", 3, true},
		{"0", 0, true},
		{"42", 42, true},
		{"2147483647", 2147483647, true},
		{"2147483648", 0, false},
		{"", 0, false},
		{"-3", 0, false},
		{"+3", 0, false},
		{" 3", 0, false},
		{"3 ", 0, false},
		{"0x3", 0, false},
		{"three", 0, false},
		{"99999999999", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseFD(tc.in)
			if !tc.ok {
				assert.ErrorContains(t, err, "not a file descriptor number")
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}

func FuzzParseFD(f *testing.F) {
	for _, s := range []string{"3", "", "-1", "2147483648", "007"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fd, err := parseFD(s)
		if err == nil && (fd < 0 || strings.Trim(s, "0123456789") != "") {
			t.Fatalf("parseFD(%q) = %d", s, fd)
		}
	})
}

func TestInheritFD(t *testing.T) {
	dir := t.TempDir()
	regular, err := os.Create(dir + "/plain")
	assert.NilError(t, err)
	defer regular.Close()
	r, w, err := os.Pipe()
	assert.NilError(t, err)
	defer w.Close()

	_, err = inheritFD(1, "x")
	assert.ErrorContains(t, err, "one of stdin, stdout and stderr")
	_, err = inheritFD(int(regular.Fd()), "x")
	assert.ErrorContains(t, err, "not a pipe or socket")

	// inheritFD takes over a descriptor the way a child takes over an
	// inherited one: give it a copy so r keeps its own.
	fd, err := syscall.Dup(int(r.Fd()))
	assert.NilError(t, err)
	assert.NilError(t, r.Close())
	f, err := inheritFD(fd, "lifeline")
	assert.NilError(t, err)
	gone := make(chan error, 1)
	go watchLifeline(f, func(err error) { gone <- err })
	_, err = w.Write([]byte("bytes are ignored"))
	assert.NilError(t, err)
	assert.NilError(t, w.Close())
	assert.ErrorContains(t, waitfor.Recv(t, gone, waitfor.Default, "the lifeline watcher to see EOF"), "EOF")
}

// recordingStdout records whether the real stdout was closed.
type recordingStdout struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	closed bool
}

func (r *recordingStdout) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, os.ErrClosed
	}
	return r.buf.Write(p)
}

func (r *recordingStdout) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return nil
}

func TestStdoutGuard(t *testing.T) {
	var logBuf bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logBuf, JSONFormat: true})
	real := &recordingStdout{}
	pr, pw := io.Pipe()
	g := newStdoutGuard(log, real, pr)
	g.start()

	writes := []string{
		"before the handshake\n",
		"1|1|unix|/tmp/plugin1|grpc|\n",
		"after the handshake\n",
		"1|1|unix|/tmp/plugin2|grpc|\n", // a second handshake-shaped line is stray
		strings.Repeat("x", maxStrayLine+10) + "\n",
		"no newline at the end",
	}
	for _, w := range writes {
		_, err := pw.Write([]byte(w))
		assert.NilError(t, err)
	}
	assert.NilError(t, pw.Close())
	waitfor.Closed(t, g.done, waitfor.Default, "the stdout guard to finish")

	assert.Check(t, g.handshakeSent())
	assert.Equal(t, real.buf.String(), "1|1|unix|/tmp/plugin1|grpc|\n")
	assert.Check(t, real.closed)
	logged := logBuf.String()
	for _, want := range []string{"before the handshake", "after the handshake", "/tmp/plugin2", "no newline at the end"} {
		assert.Check(t, is.Contains(logged, want))
	}
	assert.Check(t, !strings.Contains(logged, "/tmp/plugin1"))
}

func TestStdoutGuardWithoutHandshake(t *testing.T) {
	log := hclog.NewNullLogger()
	real := &recordingStdout{}
	pr, pw := io.Pipe()
	g := newStdoutGuard(log, real, pr)
	g.start()
	_, err := pw.Write([]byte("only noise\n"))
	assert.NilError(t, err)
	assert.NilError(t, pw.Close())
	waitfor.Closed(t, g.done, waitfor.Default, "the stdout guard to finish")
	assert.Check(t, !g.handshakeSent())
	assert.Equal(t, real.buf.String(), "")
	assert.Check(t, real.closed, "the real stdout is released once nobody can write the handshake")
}

func TestByHand(t *testing.T) {
	cfg := ServeConfig{Name: "sandbox-example", Version: "1.2.3"}
	var out, errOut bytes.Buffer
	assert.Equal(t, byHand(cfg, nil, &out, &errOut), ExitFailed)
	assert.Equal(t, out.String(), "")
	golden.Assert(t, errOut.String(), "byhand.golden")

	out.Reset()
	errOut.Reset()
	assert.Equal(t, byHand(ServeConfig{Name: "sandbox-example"}, []string{"--version"}, &out, &errOut), ExitOK)
	assert.Equal(t, out.String(), "sandbox-example (unversioned) (iii sandbox adapter, sandbox contract 1.1)\n")

	// Asked for help, the same text goes to stdout and the exit is 0.
	for _, arg := range []string{"--help", "-h", "help"} {
		out.Reset()
		errOut.Reset()
		assert.Equal(t, byHand(cfg, []string{arg}, &out, &errOut), ExitOK, arg)
		assert.Equal(t, errOut.String(), "", arg)
		golden.Assert(t, out.String(), "byhand.golden")
	}

	// An adapter that names its images gets examples with its own.
	out.Reset()
	errOut.Reset()
	withImages := ServeConfig{Name: "sandbox-example", Version: "1.2.3", Images: func() []string { return []string{"", "ruby", "go", "rust"} }}
	assert.Equal(t, byHand(withImages, nil, &out, &errOut), ExitFailed)
	golden.Assert(t, errOut.String(), "byhand-images.golden")
}

// TestServeHelp: `serve --help` describes every flag, names --fleet in its
// synopsis and example, and suggests only images the adapter has.
func TestServeHelp(t *testing.T) {
	_, remote, err := remoteArgs([]string{"serve", "--help"}, func(string) string { return "" })
	assert.Check(t, remote)
	assert.Check(t, errors.Is(err, flag.ErrHelp), "serve --help is a request for help, not a failure: %v", err)
	_, _, err = remoteArgs([]string{"--engine", "ws://e:1", "-h"}, func(string) string { return "" })
	assert.Check(t, errors.Is(err, flag.ErrHelp))

	cfg := ServeConfig{Name: "sandbox-example", Version: "1.2.3"}
	help := serveHelp(cfg)
	golden.Assert(t, help, "servehelp.golden")
	var o RemoteOptions
	serveFlags(&o, func(string) string { return "" }).VisitAll(func(f *flag.Flag) {
		assert.Check(t, is.Contains(help, "  --"+f.Name), "flag %s", f.Name)
		assert.Check(t, is.Contains(help, f.Usage), "flag %s", f.Name)
		assert.Check(t, is.Contains(help, serveEnv[f.Name]), "flag %s", f.Name)
	})
	assert.Check(t, !strings.Contains(help, "node"), "an adapter without images is not told to allow node")
	assert.Check(t, is.Contains(serveHelp(ServeConfig{Name: "x", Images: func() []string { return []string{"shell"} }}), `{"image_allowlist":["shell"]}`))
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger("a", &buf, "")
	assert.NilError(t, err)
	assert.Equal(t, log.GetLevel(), hclog.Info)
	log, err = newLogger("a", &buf, "debug")
	assert.NilError(t, err)
	assert.Equal(t, log.GetLevel(), hclog.Debug)
	log, err = newLogger("a", &buf, "loud")
	assert.ErrorContains(t, err, "unknown log level")
	assert.Equal(t, log.GetLevel(), hclog.Info)
	log.Info("hello", "k", "v")
	assert.Check(t, is.Contains(buf.String(), `"@message":"hello"`))
}
