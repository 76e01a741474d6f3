package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"

	"github.com/iii-sandbox/iii/protocol"
)

// ChannelChunkSize is the largest binary frame a ChannelWriter sends; larger
// writes are split, as the other SDKs do.
const ChannelChunkSize = 64 << 10

// Codes of channel failures.
const (
	// CodeChannelUnavailable: the engine does not know the channel id and
	// key (expired, already removed, or a wrong key).
	CodeChannelUnavailable = "CHANNEL_UNAVAILABLE"
	// CodeChannelDirection: a reference opened for the wrong direction.
	CodeChannelDirection = "CHANNEL_DIRECTION"
)

// CreateChannel asks the engine for a streaming channel (bufferSize items
// of buffering; 0 for the engine's default) and returns its two ends. Pass
// the writer or reader reference inside a payload or result to the party
// that opens it.
func (c *Client) CreateChannel(ctx context.Context, bufferSize int) (writer, reader protocol.StreamChannelRef, err error) {
	payload := map[string]int{}
	if bufferSize > 0 {
		payload["buffer_size"] = bufferSize
	}
	raw, err := c.Call(ctx, fnCreateChannel, payload)
	if err != nil {
		return writer, reader, err
	}
	var out struct {
		Writer protocol.StreamChannelRef `json:"writer"`
		Reader protocol.StreamChannelRef `json:"reader"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return writer, reader, &Error{Code: CodeHandshakeFailed, Message: "the engine's channel reply is not {writer, reader}: " + err.Error(), Err: err}
	}
	if out.Writer.ChannelID == "" || out.Reader.ChannelID == "" {
		return writer, reader, &Error{Code: CodeHandshakeFailed, Message: "the engine's channel reply lacks channel ids"}
	}
	return out.Writer, out.Reader, nil
}

// MaxChannelContent is the most content ChannelSpec.Content may hold (the
// engine's MaxChannelPrefill).
const MaxChannelContent = 64 << 10

// ChannelSpec is one channel of CreateChannels.
type ChannelSpec struct {
	// BufferSize is the items buffered between writer and reader; 0 for
	// the engine's default.
	BufferSize int
	// Filled makes Content the channel's whole stream: the engine creates
	// the channel holding it (one binary item; none when empty) with its
	// writer end already used and closed, so whoever gets the reader ref
	// reads Content, then the end of the stream, and nobody opens a writer
	// socket. At most MaxChannelContent bytes.
	Filled  bool
	Content []byte
}

// ChannelPair is the two ends of one channel.
type ChannelPair struct {
	Writer, Reader protocol.StreamChannelRef
}

// CreateChannels asks the engine for several channels in one round trip,
// one per spec, in order.
func (c *Client) CreateChannels(ctx context.Context, specs ...ChannelSpec) ([]ChannelPair, error) {
	in, err := channelsPayload(specs)
	if err != nil {
		return nil, err
	}
	raw, err := c.Call(ctx, fnCreateChannel, json.RawMessage(in))
	if err != nil {
		return nil, err
	}
	channels, ok := scanChannelPairs(raw)
	if !ok {
		var out struct {
			Channels []ChannelPair `json:"channels"`
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return nil, &Error{Code: CodeHandshakeFailed, Message: "the engine's channels reply is not {channels: [{writer, reader}]}: " + err.Error(), Err: err}
		}
		channels = out.Channels
	}
	if len(channels) != len(specs) {
		// An engine before channels: [...] answers one channel, or none.
		return nil, &Error{Code: CodeHandshakeFailed, Message: fmt.Sprintf("the engine answered %d channels for %d asked (an engine without batch channel creation?)", len(channels), len(specs))}
	}
	for _, p := range channels {
		if p.Writer.ChannelID == "" || p.Reader.ChannelID == "" {
			return nil, &Error{Code: CodeHandshakeFailed, Message: "the engine's channel reply lacks channel ids"}
		}
	}
	return channels, nil
}

// channelsPayload is engine::channels::create's input, written by hand
// (what encoding/json writes for {channels: [{buffer_size?, content?}]}):
// the http worker makes this call for every request.
func channelsPayload(specs []ChannelSpec) ([]byte, error) {
	n := 16
	for _, sp := range specs {
		if sp.Filled {
			if len(sp.Content) > MaxChannelContent {
				return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("a channel's content is at most %d bytes, not %d", MaxChannelContent, len(sp.Content))}
			}
			n += base64.StdEncoding.EncodedLen(len(sp.Content))
		}
		n += 40
	}
	in := make([]byte, 0, n)
	in = append(in, `{"channels":[`...)
	for i, sp := range specs {
		if i > 0 {
			in = append(in, ',')
		}
		in = append(in, '{')
		if sp.BufferSize != 0 {
			in = append(in, `"buffer_size":`...)
			in = strconv.AppendInt(in, int64(sp.BufferSize), 10)
		}
		if sp.Filled {
			if sp.BufferSize != 0 {
				in = append(in, ',')
			}
			in = append(in, `"content":"`...)
			in = base64.StdEncoding.AppendEncode(in, sp.Content)
			in = append(in, '"')
		}
		in = append(in, '}')
	}
	in = append(in, "]}"...)
	return in, nil
}

// scanChannelPairs reads the engine's {channels: [{writer, reader}]} in one
// pass, as encoding/json would; ok is false (and encoding/json decides) for
// anything but that shape with plain lowercase keys, each once, and plain
// string values.
func scanChannelPairs(raw []byte) (pairs []ChannelPair, ok bool) {
	if pairs, ok := matchChannelPairs(raw); ok {
		return pairs, true
	}
	seenChannels := false
	ok = protocol.ObjectMembers(raw, func(key, val []byte) bool {
		if !protocol.PlainKey(key) {
			return false
		}
		if string(key) != "channels" {
			return true
		}
		if seenChannels {
			return false
		}
		seenChannels = true
		pairs = make([]ChannelPair, 0, 2)
		return protocol.ArrayElements(val, func(elem []byte) bool {
			var p ChannelPair
			var seen [2]bool
			if !protocol.ObjectMembers(elem, func(k, v []byte) bool {
				if !protocol.PlainKey(k) {
					return false
				}
				var dst *protocol.StreamChannelRef
				switch string(k) {
				case "writer":
					dst = &p.Writer
				case "reader":
					dst = &p.Reader
				default:
					return true
				}
				i := 0
				if dst == &p.Reader {
					i = 1
				}
				if seen[i] {
					return false
				}
				seen[i] = true
				return scanChannelRef(v, dst)
			}) {
				return false
			}
			pairs = append(pairs, p)
			return true
		})
	})
	return pairs, ok && seenChannels
}

// The engine's reply, as encoding/json writes it: map keys sorted, so
// reader before writer, and each ref's fields in StreamChannelRef's order.
const (
	pairsOpen     = `{"channels":[`
	pairsClose    = `]}`
	pairReader    = `{"reader":`
	pairWriter    = `,"writer":`
	refChannelID  = `{"channel_id":"`
	refAccessKey  = `","access_key":"`
	refDirection  = `","direction":"`
	refReadClose  = protocol.DirectionRead + `"}`
	refWriteClose = protocol.DirectionWrite + `"}`
)

// matchChannelPairs reads the engine's reply when it is exactly what the
// engine writes (the layout above, ids and keys of plain printable ASCII
// without quotes or backslashes, as the engine makes them): a byte-by-byte
// match, several times quicker than a general JSON scan, which the http
// worker pays for every request's channels. Anything else is not ok, and
// the general scan decides.
func matchChannelPairs(raw []byte) ([]ChannelPair, bool) {
	rest, ok := cutPrefix(raw, pairsOpen)
	if !ok {
		return nil, false
	}
	pairs := make([]ChannelPair, 0, 2)
	if r, ok := cutPrefix(rest, pairsClose); ok {
		return pairs, len(r) == 0
	}
	for {
		var p ChannelPair
		if rest, ok = cutPrefix(rest, pairReader); !ok {
			return nil, false
		}
		if rest, ok = matchChannelRef(rest, &p.Reader, refReadClose, nil); !ok {
			return nil, false
		}
		if rest, ok = cutPrefix(rest, pairWriter); !ok {
			return nil, false
		}
		// The two ends share the channel's id and key: the writer's are
		// the reader's strings, not copies.
		if rest, ok = matchChannelRef(rest, &p.Writer, refWriteClose, &p.Reader); !ok {
			return nil, false
		}
		if len(rest) == 0 || rest[0] != '}' {
			return nil, false
		}
		pairs = append(pairs, p)
		rest = rest[1:]
		if r, ok := cutPrefix(rest, pairsClose); ok {
			return pairs, len(r) == 0
		}
		if len(rest) == 0 || rest[0] != ',' {
			return nil, false
		}
		rest = rest[1:]
	}
}

// matchChannelRef reads {"channel_id":"…","access_key":"…","direction":"…"}
// whose direction and closing are end; an id or key equal to same's is
// same's string.
func matchChannelRef(raw []byte, ref *protocol.StreamChannelRef, end string, same *protocol.StreamChannelRef) ([]byte, bool) {
	var sameID, sameKey string
	if same != nil {
		sameID, sameKey = same.ChannelID, same.AccessKey
	}
	rest, ok := cutPrefix(raw, refChannelID)
	if !ok {
		return nil, false
	}
	if ref.ChannelID, rest, ok = plainUntilQuote(rest, sameID); !ok {
		return nil, false
	}
	if rest, ok = cutPrefix(rest, refAccessKey); !ok {
		return nil, false
	}
	if ref.AccessKey, rest, ok = plainUntilQuote(rest, sameKey); !ok {
		return nil, false
	}
	if rest, ok = cutPrefix(rest, refDirection+end); !ok {
		return nil, false
	}
	ref.Direction = end[:len(end)-len(`"}`)]
	return rest, true
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return nil, false
	}
	return b[len(prefix):], true
}

// plainUntilQuote is the string up to the next '"' (which it leaves in
// rest) when every byte before it is printable ASCII other than '\\':
// JSON that decodes to itself. When it equals reuse, it is reuse.
func plainUntilQuote(b []byte, reuse string) (s string, rest []byte, ok bool) {
	for i, c := range b {
		switch {
		case c == '"':
			if string(b[:i]) == reuse {
				return reuse, b[i:], true
			}
			return string(b[:i]), b[i:], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return "", nil, false
		}
	}
	return "", nil, false
}

func scanChannelRef(raw []byte, ref *protocol.StreamChannelRef) bool {
	var seen [3]bool
	return protocol.ObjectMembers(raw, func(k, v []byte) bool {
		if !protocol.PlainKey(k) {
			return false
		}
		var dst *string
		i := 0
		switch string(k) {
		case "channel_id":
			dst = &ref.ChannelID
		case "access_key":
			dst, i = &ref.AccessKey, 1
		case "direction":
			dst, i = &ref.Direction, 2
		default:
			return true
		}
		if seen[i] {
			return false
		}
		seen[i] = true
		s, ok := protocol.PlainString(v)
		*dst = s
		return ok
	})
}

// DropChannels asks the engine to remove channels at once, given one ref of
// each (the id and access key are the proof): their open ends close as
// going away, and they no longer hold the connection's channel slots. It
// returns once the engine has removed them; unknown or finished channels
// are skipped.
func (c *Client) DropChannels(ctx context.Context, refs ...protocol.StreamChannelRef) error {
	for len(refs) > 0 {
		n := min(len(refs), maxDropBatch)
		if _, err := c.Call(ctx, fnDropChannels, dropPayload(refs[:n])); err != nil {
			return err
		}
		refs = refs[n:]
	}
	return nil
}

// dropPayload is engine::channels::drop's input for refs,
// {channels: [{channel_id, access_key}]}: written by hand, byte for byte
// what Call's encoder writes, when every id and key is plain (the engine's
// are), since the http worker sends it for every few requests; otherwise
// the value for Call to encode.
func dropPayload(refs []protocol.StreamChannelRef) any {
	out := make([]byte, 0, 16+len(refs)*110)
	out = append(out, `{"channels":[`...)
	for i, r := range refs {
		if !plainJSONString(r.ChannelID) || !plainJSONString(r.AccessKey) {
			type ref struct {
				ChannelID string `json:"channel_id"`
				AccessKey string `json:"access_key"`
			}
			in := make([]ref, len(refs))
			for i, r := range refs {
				in[i] = ref{r.ChannelID, r.AccessKey}
			}
			return map[string]any{"channels": in}
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"channel_id":"`...)
		out = append(out, r.ChannelID...)
		out = append(out, `","access_key":"`...)
		out = append(out, r.AccessKey...)
		out = append(out, `"}`...)
	}
	return json.RawMessage(append(out, "]}"...))
}

// plainJSONString reports whether s is written as it is between quotes:
// printable ASCII other than '"' and '\\'.
func plainJSONString(s string) bool {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// maxDropBatch is the most refs one drop call carries (the engine's
// MaxChannelDropBatch).
const maxDropBatch = 256

// ChannelURL is the WebSocket address of one end of a channel on this
// client's engine.
func (c *Client) ChannelURL(ref protocol.StreamChannelRef) string {
	u := c.base
	u.Path = "/ws/channels/" + ref.ChannelID
	u.RawQuery = url.Values{"key": {ref.AccessKey}, "dir": {ref.Direction}}.Encode()
	return u.String()
}

func (c *Client) dialChannel(ctx context.Context, ref protocol.StreamChannelRef, want string) (*websocket.Conn, error) {
	if ref.Direction != want {
		return nil, &Error{Code: CodeChannelDirection, Message: fmt.Sprintf("channel %s: a %q reference cannot be opened for %s", ref.ChannelID, ref.Direction, want)}
	}
	if ref.ChannelID == "" {
		return nil, &Error{Code: CodeInvalidArgument, Message: "channel reference without channel_id"}
	}
	dctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	u := c.ChannelURL(ref)
	conn, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: c.httpClient, HTTPHeader: c.opts.Header})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, &Error{Code: CodeChannelUnavailable, Err: err,
				Message: fmt.Sprintf("channel %s is unknown to the engine (expired, removed, or a wrong key)", ref.ChannelID)}
		}
		return nil, unreachable(c.base.String(), err, resp)
	}
	conn.SetReadLimit(maxMessageSize)
	return conn, nil
}

// ChannelWriter is the write end of a channel: binary bytes through Write,
// text messages through SendText. Close ends the stream for the reader.
type ChannelWriter struct {
	conn   *websocket.Conn
	ctx    context.Context // for Write; ends at Close
	cancel context.CancelFunc
	once   sync.Once
	err    error
}

var _ io.WriteCloser = (*ChannelWriter)(nil)

// OpenChannelWriter connects to the write end of a channel. ctx bounds the
// dialling only.
func (c *Client) OpenChannelWriter(ctx context.Context, ref protocol.StreamChannelRef) (*ChannelWriter, error) {
	conn, err := c.dialChannel(ctx, ref, protocol.DirectionWrite)
	if err != nil {
		return nil, err
	}
	w := &ChannelWriter{conn: conn}
	// Nothing is expected from the engine on a write end, but control
	// frames (ping, close) still have to be read.
	w.ctx = conn.CloseRead(context.Background())
	w.ctx, w.cancel = context.WithCancel(w.ctx)
	return w, nil
}

// Write sends p as binary frames of at most ChannelChunkSize bytes.
func (w *ChannelWriter) Write(p []byte) (int, error) { return w.WriteContext(w.ctx, p) }

// WriteContext is Write bounded by ctx. Cancelling ctx mid-write breaks the
// channel (the WebSocket library closes a connection whose write was
// interrupted).
func (w *ChannelWriter) WriteContext(ctx context.Context, p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), ChannelChunkSize)]
		if err := w.conn.Write(ctx, websocket.MessageBinary, chunk); err != nil {
			return n, fmt.Errorf("channel write: %w", err)
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// SendText sends one text message.
func (w *ChannelWriter) SendText(ctx context.Context, msg string) error {
	if err := w.conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		return fmt.Errorf("channel send text: %w", err)
	}
	return nil
}

// Close ends the stream normally; the reader sees io.EOF after the data
// written before.
func (w *ChannelWriter) Close() error {
	w.once.Do(func() {
		err := w.conn.Close(websocket.StatusNormalClosure, "")
		w.cancel()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			w.err = fmt.Errorf("channel close: %w", err)
		}
	})
	return w.err
}

// ChannelMessage is one message read from a channel.
type ChannelMessage struct {
	Text bool   // a text message; otherwise binary
	Data []byte // the payload
}

// ChannelReader is the read end of a channel. Read yields the binary
// bytes as one stream; text messages met on the way go to the text handler
// (or are dropped without one). ReadMessage returns whole messages of both
// kinds instead. Use one style per reader; it is not safe for concurrent
// use.
type ChannelReader struct {
	conn   *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	onText func(string)
	cur    io.Reader // the unread rest of the current binary message
	err    error     // sticky end-of-stream or failure
	once   sync.Once
}

var _ io.ReadCloser = (*ChannelReader)(nil)

// ReaderOption configures OpenChannelReader.
type ReaderOption func(*ChannelReader)

// WithTextHandler receives the text messages Read meets, in order, on the
// reading goroutine.
func WithTextHandler(f func(string)) ReaderOption {
	return func(r *ChannelReader) { r.onText = f }
}

// OpenChannelReader connects to the read end of a channel. ctx bounds the
// dialling only.
func (c *Client) OpenChannelReader(ctx context.Context, ref protocol.StreamChannelRef, opts ...ReaderOption) (*ChannelReader, error) {
	conn, err := c.dialChannel(ctx, ref, protocol.DirectionRead)
	if err != nil {
		return nil, err
	}
	r := &ChannelReader{conn: conn}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// Read reads binary stream bytes; io.EOF once the writer closed and
// everything was read.
func (r *ChannelReader) Read(p []byte) (int, error) {
	for {
		if r.cur != nil {
			n, err := r.cur.Read(p)
			if errors.Is(err, io.EOF) {
				r.cur = nil
				if n > 0 {
					return n, nil
				}
				continue
			}
			if err != nil {
				r.err = r.end(err)
				r.cur = nil
				return n, r.err
			}
			return n, nil
		}
		if r.err != nil {
			return 0, r.err
		}
		typ, rd, err := r.conn.Reader(r.ctx)
		if err != nil {
			r.err = r.end(err)
			return 0, r.err
		}
		if typ == websocket.MessageText {
			data, err := io.ReadAll(rd)
			if err != nil {
				r.err = r.end(err)
				return 0, r.err
			}
			if r.onText != nil {
				r.onText(string(data))
			}
			continue
		}
		r.cur = rd
	}
}

// ReadMessage returns the next whole message (or the rest of a binary
// message Read started); io.EOF at the end of the stream.
func (r *ChannelReader) ReadMessage(ctx context.Context) (ChannelMessage, error) {
	if r.cur != nil {
		data, err := io.ReadAll(r.cur)
		r.cur = nil
		if err != nil {
			r.err = r.end(err)
			return ChannelMessage{}, r.err
		}
		return ChannelMessage{Data: data}, nil
	}
	if r.err != nil {
		return ChannelMessage{}, r.err
	}
	typ, data, err := r.conn.Read(ctx)
	if err != nil {
		r.err = r.end(err)
		return ChannelMessage{}, r.err
	}
	return ChannelMessage{Text: typ == websocket.MessageText, Data: data}, nil
}

// end maps the connection's end to the stream's: a normal close by the
// engine is io.EOF, anything else an error.
func (r *ChannelReader) end(err error) error {
	if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
		return io.EOF
	}
	return fmt.Errorf("channel read: %w", err)
}

// Close releases the reader; reading stops even mid-stream.
func (r *ChannelReader) Close() error {
	r.once.Do(func() {
		_ = r.conn.Close(websocket.StatusNormalClosure, "")
		r.cancel()
	})
	return nil
}
