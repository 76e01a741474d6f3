package httpworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
)

// Streaming, as upstream's trigger-type generation: every request carries
// two channel refs, request_body (read end: the raw body, as sent) and
// response (write end). A function that returns null answers through the
// response channel: text messages {"type":"set_status","status_code":n}
// and {"type":"set_headers","headers":{…}} before the body, binary
// messages the body, the writer's close its end (the `http()` helper of
// @iii-dev/helpers writes exactly that). The worker opens its own ends as
// the request starts, so a function may write before it returns; when the
// request ends both channels are dropped (engine::channels::drop), so an
// unused channel does not hold a slot of the worker's connection.

// maxStreamHeaders bounds one set_headers message.
const maxStreamHeaders = 64 << 10

// Streams opens the two channels of one request.
type Streams interface {
	Open(ctx context.Context, body []byte) (RequestStreams, error)
}

// RequestStreams is one request's channels, as the worker holds them.
type RequestStreams interface {
	// Refs are what the function receives: the request body's read end
	// and the response's write end.
	Refs() (requestBody, response protocol.StreamChannelRef)
	// Response waits for the worker's read end of the response channel.
	Response(ctx context.Context) (MessageReader, error)
	// Close releases the worker's ends and drops both channels.
	Close()
}

// MessageReader is the read end of a channel, a message at a time; io.EOF
// once the writer closed it.
type MessageReader interface {
	ReadMessage(ctx context.Context) (client.ChannelMessage, error)
}

// ClientStreams opens channels through a connected client.
type ClientStreams struct {
	C   *client.Client
	Log hclog.Logger
}

// Open creates the request's channels, starts writing body into the first
// and opening the read end of the second.
func (cs ClientStreams) Open(ctx context.Context, body []byte) (RequestStreams, error) {
	// The two creations are independent: in parallel, one round trip.
	type created struct {
		w, r protocol.StreamChannelRef
		err  error
	}
	second := make(chan created, 1)
	go func() {
		w, r, err := cs.C.CreateChannel(ctx, 0)
		second <- created{w, r, err}
	}()
	reqW, reqR, err := cs.C.CreateChannel(ctx, 0)
	res := <-second
	if err != nil || res.err != nil {
		if err == nil {
			cs.drop(reqR)
			return nil, fmt.Errorf("create the response channel: %w", res.err)
		}
		if res.err == nil {
			cs.drop(res.r)
		}
		return nil, fmt.Errorf("create the request_body channel: %w", err)
	}
	resW, resR := res.w, res.r
	s := &clientStreams{cs: cs, reqR: reqR, resW: resW, resR: resR, opened: make(chan struct{}), wrote: make(chan struct{})}
	// The ends live as long as the request, not as the call that opened them.
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	go func() {
		defer close(s.wrote)
		w, err := cs.C.OpenChannelWriter(octx, reqW)
		if err != nil {
			return
		}
		if len(body) > 0 {
			_, _ = w.WriteContext(octx, body)
		}
		_ = w.Close()
	}()
	go func() {
		defer close(s.opened)
		s.reader, s.openErr = cs.C.OpenChannelReader(octx, resR)
	}()
	return s, nil
}

func (cs ClientStreams) drop(ref protocol.StreamChannelRef) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cs.C.Call(ctx, "engine::channels::drop", map[string]string{"channel_id": ref.ChannelID, "access_key": ref.AccessKey}, client.Void()); err != nil && cs.Log != nil {
		cs.Log.Debug("drop a request's channel", "channel_id", ref.ChannelID, "error", err)
	}
}

type clientStreams struct {
	cs               ClientStreams
	reqR, resW, resR protocol.StreamChannelRef
	cancel           context.CancelFunc

	opened  chan struct{}
	reader  *client.ChannelReader
	openErr error
	wrote   chan struct{}
	once    sync.Once
}

func (s *clientStreams) Refs() (protocol.StreamChannelRef, protocol.StreamChannelRef) {
	return s.reqR, s.resW
}

func (s *clientStreams) Response(ctx context.Context) (MessageReader, error) {
	select {
	case <-s.opened:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s.openErr != nil {
		return nil, s.openErr
	}
	return s.reader, nil
}

func (s *clientStreams) Close() {
	s.once.Do(func() {
		// Dropping first ends whatever still runs on either channel.
		s.cs.drop(s.reqR)
		s.cs.drop(s.resR)
		s.cancel()
		<-s.opened
		if s.reader != nil {
			_ = s.reader.Close()
		}
		<-s.wrote
	})
}

// streamControl is a text message on the response channel.
type streamControl struct {
	Type       string          `json:"type"`
	StatusCode int             `json:"status_code"`
	Headers    json.RawMessage `json:"headers"`
}

// streamResponse answers from the response channel: status and headers
// from its text messages until the first body bytes, then the body. Each
// wait for a message is bounded by idle (default_timeout); nothing at all
// within it answers 504.
func (w *Worker) streamResponse(ctx context.Context, rw http.ResponseWriter, st RequestStreams, idle time.Duration, route string) {
	status, started := http.StatusOK, false
	start := func() {
		if !started {
			started = true
			rw.WriteHeader(status)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, idle)
	r, err := st.Response(wctx)
	cancel()
	if err != nil {
		w.callFailed(rw, wctx, "the response channel of "+route, err, CodeTimeout)
		return
	}
	flusher, _ := rw.(http.Flusher)
	for {
		mctx, cancel := context.WithTimeout(ctx, idle)
		m, err := r.ReadMessage(mctx)
		timedOut := mctx.Err() == context.DeadlineExceeded
		cancel()
		if errors.Is(err, io.EOF) {
			start()
			return
		}
		if err != nil {
			if started {
				// The status is out: all that is left is to cut the body.
				w.log.Debug("streamed response ended early", "route", route, "error", err)
				panic(http.ErrAbortHandler)
			}
			if timedOut {
				writeError(rw, http.StatusGatewayTimeout, CodeTimeout, route+" returned a streaming response (null) and wrote nothing within default_timeout")
				return
			}
			if ctx.Err() != nil {
				return // the client went away
			}
			writeError(rw, http.StatusInternalServerError, CodeInternal, "reading the streamed response of "+route+": "+err.Error())
			return
		}
		if !m.Text {
			start()
			if _, err := rw.Write(m.Data); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			continue
		}
		if started {
			w.log.Warn("a streamed response set its status or headers after the body began; ignored", "route", route)
			continue
		}
		if err := applyControl(rw.Header(), &status, m.Data); err != nil {
			w.log.Warn("ignoring a malformed message on a response channel", "route", route, "error", err)
		}
	}
}

// applyControl applies one set_status / set_headers message.
func applyControl(h http.Header, status *int, data []byte) error {
	if len(data) > maxStreamHeaders {
		return fmt.Errorf("a control message of %d bytes (at most %d)", len(data), maxStreamHeaders)
	}
	var c streamControl
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("not a JSON control message: %v", err)
	}
	switch c.Type {
	case "set_status":
		if c.StatusCode < 100 || c.StatusCode > 999 {
			return fmt.Errorf("set_status %d is not an HTTP status", c.StatusCode)
		}
		*status = c.StatusCode
		return nil
	case "set_headers":
		if len(bytes.TrimSpace(c.Headers)) == 0 {
			return errors.New("set_headers without headers")
		}
		return addHeaders(h, c.Headers)
	default:
		return fmt.Errorf("unknown control message type %s", strconv.Quote(c.Type))
	}
}
