package sdk

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// go-plugin's host reads the plugin's first stdout line as the handshake
// ("CORE|APP|NETWORK|ADDR|PROTOCOL|CERT[|MUX]"); any other line printed
// first makes the host fail with "Unrecognized remote plugin message". An
// adapter's code (or a library it uses) that prints to stdout must
// therefore never reach the real stdout. stdoutGuard owns the real stdout:
// go-plugin writes its handshake into a pipe the guard reads, the guard
// forwards only the handshake line and logs everything else on stderr.

// maxStrayLine bounds how much of one unterminated stdout line is held
// before it is logged in pieces.
const maxStrayLine = 64 << 10

// stdoutGuard forwards the handshake line from an intercept pipe to the
// real stdout and logs every other byte written to the pipe.
type stdoutGuard struct {
	log       hclog.Logger
	real      io.WriteCloser
	in        io.Reader
	handshake chan struct{} // closed once the handshake line went out
	done      chan struct{} // closed when the pump has returned
	once      sync.Once
}

func newStdoutGuard(log hclog.Logger, real io.WriteCloser, in io.Reader) *stdoutGuard {
	return &stdoutGuard{
		log:       log,
		real:      real,
		in:        in,
		handshake: make(chan struct{}),
		done:      make(chan struct{}),
	}
}

// start runs the pump until the intercept pipe's write side is closed.
func (g *stdoutGuard) start() {
	go func() {
		defer close(g.done)
		g.pump()
	}()
}

// handshakeSent reports whether the handshake line has gone out.
func (g *stdoutGuard) handshakeSent() bool {
	select {
	case <-g.handshake:
		return true
	default:
		return false
	}
}

func (g *stdoutGuard) pump() {
	br := bufio.NewReaderSize(g.in, maxStrayLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			g.line(line, errors.Is(err, bufio.ErrBufferFull))
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			// The real stdout is never needed again once no one can
			// write the handshake.
			g.closeReal()
			return
		}
	}
}

func (g *stdoutGuard) line(line []byte, partial bool) {
	if !partial && !g.handshakeSent() && isHandshakeLine(string(line)) {
		_, err := g.real.Write(line)
		close(g.handshake)
		g.closeReal()
		if err != nil {
			g.log.Error("could not write the plugin handshake to stdout", "error", err)
		}
		return
	}
	g.log.Warn("stdout output redirected to the log: an adapter plugin's stdout carries only the go-plugin handshake; log through the hclog.Logger instead",
		"output", strings.TrimRight(string(line), "\r\n"))
}

func (g *stdoutGuard) closeReal() {
	g.once.Do(func() { _ = g.real.Close() })
}

// isHandshakeLine recognises go-plugin's handshake line:
// "1|<app version>|<network>|<address>|<protocol>|<server cert>" with an
// optional seventh multiplexing field. Only the gRPC protocol counts:
// adapters serve nothing else.
func isHandshakeLine(line string) bool {
	line = strings.TrimRight(line, "\r\n")
	parts := strings.Split(line, "|")
	if len(parts) < 6 || len(parts) > 7 {
		return false
	}
	if parts[0] != "1" {
		return false
	}
	if _, err := strconv.ParseUint(parts[1], 10, 32); err != nil {
		return false
	}
	switch parts[2] {
	case "unix", "tcp":
	default:
		return false
	}
	if parts[3] == "" || parts[4] != "grpc" {
		return false
	}
	if len(parts) == 7 {
		if _, err := strconv.ParseBool(parts[6]); err != nil {
			return false
		}
	}
	return true
}

// interceptStdout points os.Stdout at a pipe read by a guard that forwards
// the handshake to real. It returns the guard, already pumping.
func interceptStdout(log hclog.Logger, real io.WriteCloser) (*stdoutGuard, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	g := newStdoutGuard(log, real, r)
	g.start()
	// os.Stdout is the process's stdout variable; Serve owns the process,
	// so redirecting it here is the point, not a side effect.
	os.Stdout = w
	return g, nil
}
