package usernet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// relayBufSize is each direction's copy buffer.
const relayBufSize = 32 << 10

// lastSeen is when a flow last carried anything.
type lastSeen struct{ t atomic.Int64 }

func (l *lastSeen) touch() { l.t.Store(time.Now().UnixNano()) }
func (l *lastSeen) olderThan(d time.Duration) bool {
	return time.Since(time.Unix(0, l.t.Load())) >= d
}

// halfCloser is a connection whose write side closes alone (TCP's FIN).
type halfCloser interface {
	CloseWrite() error
}

// bufferedConn reads through a bufio.Reader that may already hold bytes
// read from the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *bufferedConn) CloseWrite() error {
	if h, ok := c.Conn.(halfCloser); ok {
		return h.CloseWrite()
	}
	return c.Conn.Close()
}

// relay copies bytes both ways between a guest's connection and its host
// connection until both directions ended or ctx ends; an end of stream is
// passed on as a half-close, an error closes both.
func relay(ctx context.Context, guest, host net.Conn) {
	closeBoth := func() { _ = guest.Close(); _ = host.Close() }
	stop := context.AfterFunc(ctx, closeBoth)
	defer stop()
	var wg sync.WaitGroup
	one := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, relayBufSize)
		// Plain Reader and Writer: no ReaderFrom/WriterTo fast path
		// that would bypass the bounded buffer.
		_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
		if err != nil {
			closeBoth()
			return
		}
		if h, ok := dst.(halfCloser); ok {
			_ = h.CloseWrite()
		} else {
			closeBoth()
		}
	}
	wg.Add(2)
	go one(host, guest)
	go one(guest, host)
	wg.Wait()
	closeBoth()
}

// Time limits of an HTTP forward before it becomes a plain relay.
const (
	headTimeout     = 30 * time.Second // the guest's request head
	responseTimeout = 60 * time.Second // the host's whole non-101 response
	// maxResponseBody bounds a non-101 response relayed to the guest.
	maxResponseBody = 1 << 20
)

// badRequest is what a guest gets for a request head the forward refuses.
const badRequest = "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"

// relayHTTP runs an HTTP forward over one guest connection: one request
// head from the guest, rewritten for the upstream (its Host, and the
// token when there is one); nothing more from the guest until the host's
// status line; then a byte relay (101) or the response and the end.
func relayHTTP(ctx context.Context, guest, host net.Conn, upstream, token string) error {
	stop := context.AfterFunc(ctx, func() { _ = guest.Close(); _ = host.Close() })
	defer stop()
	closeBoth := func() { _ = guest.Close(); _ = host.Close() }

	gr := bufio.NewReaderSize(guest, 4<<10)
	_ = guest.SetReadDeadline(time.Now().Add(headTimeout))
	head, err := readHead(gr)
	if err != nil {
		if errors.Is(err, ErrBadHead) {
			writeBadRequest(guest, err)
		}
		closeBoth()
		return fmt.Errorf("the guest's request head: %w", err)
	}
	out, method, err := RewriteRequestHead(head, upstream, token)
	if err != nil {
		writeBadRequest(guest, err)
		closeBoth()
		return err
	}
	_ = guest.SetReadDeadline(time.Time{})

	_ = host.SetDeadline(time.Now().Add(responseTimeout))
	if _, err := host.Write(out); err != nil {
		closeBoth()
		return fmt.Errorf("send the request: %w", err)
	}
	hr := bufio.NewReaderSize(host, 4<<10)
	rhead, err := readHead(hr)
	if err != nil {
		closeBoth()
		return fmt.Errorf("the host's response head: %w", err)
	}
	code, err := statusCode(rhead)
	if err != nil {
		closeBoth()
		return err
	}
	if code == http.StatusSwitchingProtocols {
		_ = host.SetDeadline(time.Time{})
		if _, err := guest.Write(rhead); err != nil {
			closeBoth()
			return err
		}
		// Whatever either side sent early sits in the readers.
		relay(ctx, &bufferedConn{Conn: guest, r: gr}, &bufferedConn{Conn: host, r: hr})
		return nil
	}
	defer closeBoth()
	resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(bytes.NewReader(rhead), hr)), &http.Request{Method: method})
	if err != nil {
		return fmt.Errorf("the host's response: %w", err)
	}
	defer resp.Body.Close()
	resp.Body = struct{ io.ReadCloser }{http.MaxBytesReader(nil, resp.Body, maxResponseBody)}
	_ = guest.SetWriteDeadline(time.Now().Add(responseTimeout))
	return resp.Write(guest)
}

func writeBadRequest(w net.Conn, why error) {
	msg := why.Error() + "\n"
	_ = w.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = fmt.Fprintf(w, badRequest, len(msg), msg)
}
