package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/protocol"
)

func channelURL(te *testEngine, ref protocol.StreamChannelRef) string {
	return te.url + "/ws/channels/" + ref.ChannelID + "?key=" + url.QueryEscape(ref.AccessKey) + "&dir=" + ref.Direction
}

func dialChannel(t *testing.T, te *testEngine, ref protocol.StreamChannelRef) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, _, err := websocket.Dial(ctx, channelURL(te, ref), nil)
	assert.NilError(t, err)
	c.SetReadLimit(readLimit)
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func createChannel(t *testing.T, w *rawClient, data string) (writer, reader protocol.StreamChannelRef) {
	t.Helper()
	res := w.call("ch-"+data, FnChannelsCreate, nil, data)
	var out struct {
		Writer protocol.StreamChannelRef `json:"writer"`
		Reader protocol.StreamChannelRef `json:"reader"`
	}
	assert.NilError(t, json.Unmarshal(mustJSON(t, res["result"]), &out), "%v", res)
	return out.Writer, out.Reader
}

func TestChannelRelay(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	writer, reader := createChannel(t, w, `{"buffer_size":2}`)
	assert.Equal(t, writer.ChannelID, reader.ChannelID)
	assert.Equal(t, writer.AccessKey, reader.AccessKey)
	assert.Equal(t, writer.Direction, "write")
	assert.Equal(t, reader.Direction, "read")

	wc := dialChannel(t, te, writer)
	rc := dialChannel(t, te, reader)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	sent := []struct {
		typ  websocket.MessageType
		data string
	}{
		{websocket.MessageText, `{"line":1}`},
		{websocket.MessageBinary, "\x00\x01\x02"},
		{websocket.MessageText, "plain text"},
		{websocket.MessageBinary, string(make([]byte, 70_000))},
		{websocket.MessageText, "last"},
	}
	// More items than the buffer holds: the writer is held back, not failed.
	go func() {
		for _, m := range sent {
			if wc.Write(ctx, m.typ, []byte(m.data)) != nil {
				return
			}
		}
		_ = wc.Close(websocket.StatusNormalClosure, "stream_complete")
	}()
	for i, m := range sent {
		typ, data, err := rc.Read(ctx)
		assert.NilError(t, err, "item %d", i)
		assert.Equal(t, typ, m.typ, "item %d", i)
		assert.Equal(t, string(data), m.data, "item %d", i)
	}
	_, _, err := rc.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusNormalClosure, "reader gets a normal close once the writer is done: %v", err)
	pollUntil(t, "finished channel forgotten", func() bool { return te.channels.get(writer.ChannelID) == nil })
}

func TestChannelRefusals(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	writer, reader := createChannel(t, w, `{}`)

	bad := writer
	bad.AccessKey = "wrong"
	unknown := writer
	unknown.ChannelID = "no-such-channel"
	assert.Equal(t, httpStatus(t, channelURL(te, bad)), http.StatusNotFound)
	assert.Equal(t, httpStatus(t, channelURL(te, unknown)), http.StatusNotFound)
	noKey := te.url + "/ws/channels/" + writer.ChannelID + "?dir=write"
	assert.Equal(t, httpStatus(t, noKey), http.StatusNotFound)
	badDir := writer
	badDir.Direction = "sideways"
	assert.Equal(t, httpStatus(t, channelURL(te, badDir)), http.StatusBadRequest)

	// One take per side: whichever taker comes second is closed at once
	// (the two dials race to take the end, so either may be second).
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	closed := make(chan error, 2)
	for range 2 {
		c := dialChannel(t, te, reader)
		go func() {
			_, _, err := c.Read(ctx)
			closed <- err
		}()
	}
	err := <-closed
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusPolicyViolation, "%v", err)
}

func TestChannelSweepAndOwnerCleanup(t *testing.T) {
	te := startEngine(t, Options{ChannelTTL: 10 * time.Millisecond, ChannelSweepInterval: 5 * time.Millisecond})

	t.Run("TTL sweep removes channels not fully taken", func(t *testing.T) {
		w, _ := te.CreateChannel(0)
		pollUntil(t, "stale channel swept", func() bool { return te.channels.get(w.ChannelID) == nil })
		assert.Equal(t, httpStatus(t, channelURL(te, w)), http.StatusNotFound)
	})

	t.Run("fully taken channels are not swept", func(t *testing.T) {
		writer, reader := te.CreateChannel(4)
		wc := dialChannel(t, te, writer)
		rc := dialChannel(t, te, reader)
		// A channel made after it and never taken is swept once it is past
		// the TTL: by then the taken one is too, and a sweep has passed
		// over it.
		canary, _ := te.CreateChannel(0)
		pollUntil(t, "the untaken canary channel swept", func() bool { return te.channels.get(canary.ChannelID) == nil })
		assert.Assert(t, te.channels.get(writer.ChannelID) != nil, "the fully taken channel was swept")
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.NilError(t, wc.Write(ctx, websocket.MessageText, []byte("still here")))
		_, data, err := rc.Read(ctx)
		assert.NilError(t, err)
		assert.Equal(t, string(data), "still here")
	})

	t.Run("removed when the creating worker disconnects", func(t *testing.T) {
		long := startEngine(t, Options{})
		w := long.dial(t)
		writer, reader := createChannel(t, w, `{"buffer_size":5000}`)
		assert.Equal(t, long.channels.get(writer.ChannelID).size, maxChannelBuffer, "buffer_size is capped")
		rc := dialChannel(t, long, reader)
		assert.NilError(t, w.c.CloseNow())
		pollUntil(t, "owned channel removed", func() bool { return long.channels.get(writer.ChannelID) == nil })
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		_, _, err := rc.Read(ctx)
		assert.Assert(t, err != nil, "the taken end is closed")
		assert.Equal(t, httpStatus(t, channelURL(long, writer)), http.StatusNotFound)
	})
}

func TestChannelCreateValidation(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	for _, in := range []string{`{"buffer_size":0}`, `{"buffer_size":-3}`, `{"buffer_size":"big"}`, `[1]`} {
		res := w.call("cv"+in, FnChannelsCreate, nil, in)
		code, _ := errBody(t, res)
		assert.Equal(t, code, CodeInvalidArgument, "input %s", in)
	}
	writer, _ := createChannel(t, w, ``)
	assert.Equal(t, te.channels.get(writer.ChannelID).size, defaultChannelBuffer)
}

// TestChannelDrop: engine::channels::drop removes a channel at once, given
// its id and key: its slot is free again (a connection at its limit
// creates another), an open end closes as going away, and a wrong key or
// an unknown id answer dropped:false and touch nothing.
func TestChannelDrop(t *testing.T) {
	te := startEngine(t, Options{})
	c := te.dial(t)
	var last protocol.StreamChannelRef
	for i := range MaxChannelsPerConnection {
		last, _ = createChannel(t, c, fmt.Sprintf(`{"buffer_size":%d}`, i%1000+1))
	}
	f := c.call("over", FnChannelsCreate, nil, `{}`)
	code, _ := errBody(t, f)
	assert.Equal(t, code, CodeLimitExceeded)

	writer, reader := createChannel(t, te.dial(t), `{}`)
	open := dialChannel(t, te, reader)
	for _, tc := range []struct {
		in      string
		dropped bool
	}{
		{`{"channel_id":"` + writer.ChannelID + `","access_key":"wrong"}`, false},
		{`{"channel_id":"nope","access_key":"` + writer.AccessKey + `"}`, false},
		{string(mustJSON(t, writer)), true},
		{string(mustJSON(t, writer)), false}, // gone already
	} {
		f := c.call("drop", FnChannelsDrop, nil, tc.in)
		assert.Assert(t, f["error"] == nil, "%s: %v", tc.in, f)
		assert.DeepEqual(t, f["result"], map[string]any{"dropped": tc.dropped})
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, _, err := open.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), statusGoingAway, "%v", err)

	f = c.call("bad", FnChannelsDrop, nil, `{"channel_id":"x"}`)
	code, _ = errBody(t, f)
	assert.Equal(t, code, CodeInvalidArgument)

	// The connection at its limit drops one and creates one.
	f = c.call("drop-last", FnChannelsDrop, nil, string(mustJSON(t, last)))
	assert.DeepEqual(t, f["result"], map[string]any{"dropped": true})
	f = c.call("again", FnChannelsCreate, nil, `{}`)
	assert.Assert(t, f["error"] == nil, "%v", f)
}

// TestChannelCreateReplyAsJSON: engine::channels::create writes its answer
// by hand, byte for byte what json.Marshal wrote from maps of the refs
// (clients match those bytes exactly), single and batched.
func TestChannelCreateReplyAsJSON(t *testing.T) {
	te := startEngine(t, Options{})
	type pair struct {
		Writer protocol.StreamChannelRef `json:"writer"`
		Reader protocol.StreamChannelRef `json:"reader"`
	}
	asMaps := func(ps []pair) []map[string]protocol.StreamChannelRef {
		var out []map[string]protocol.StreamChannelRef
		for _, p := range ps {
			out = append(out, map[string]protocol.StreamChannelRef{"writer": p.Writer, "reader": p.Reader})
		}
		return out
	}
	for _, tc := range []struct {
		name, in string
		batch    bool
	}{
		{"single", `{}`, false},
		{"single with a buffer size", `{"buffer_size":3}`, false},
		{"one in a batch", `{"channels":[{}]}`, true},
		{"a batch", `{"channels":[{"content":"aGVsbG8="},{"buffer_size":3},{"content":""},{}]}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errb := te.fnChannelsCreate(context.Background(), &Call{Data: json.RawMessage(tc.in), CallerAdmin: true})
			assert.Assert(t, errb == nil, "%v", errb)
			got, ok := out.(json.RawMessage)
			assert.Assert(t, ok, "%T", out)
			var want []byte
			var err error
			if tc.batch {
				var v struct {
					Channels []pair `json:"channels"`
				}
				assert.NilError(t, json.Unmarshal(got, &v), "%s", got)
				assert.Assert(t, len(v.Channels) > 0 && v.Channels[0].Writer.ChannelID != "", "%s", got)
				want, err = json.Marshal(map[string]any{"channels": asMaps(v.Channels)})
			} else {
				var v pair
				assert.NilError(t, json.Unmarshal(got, &v), "%s", got)
				assert.Assert(t, v.Writer.ChannelID != "" && v.Writer.Direction == protocol.DirectionWrite, "%s", got)
				want, err = json.Marshal(asMaps([]pair{v})[0])
			}
			assert.NilError(t, err)
			assert.Equal(t, string(got), string(want))
		})
	}
}

// TestChannelCreateBatch: one create call makes several channels; one
// given content holds it as its whole stream, its writer end already used
// (a socket on it is refused), and its reader gets the content then a
// normal close; "" is an empty stream. The engine's channel budget is
// charged for the content until it is read.
func TestChannelCreateBatch(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	res := w.call("batch", FnChannelsCreate, nil, `{"channels":[{"content":"aGVsbG8="},{"buffer_size":3},{"content":""}]}`)
	assert.Assert(t, res["error"] == nil, "%v", res)
	var out struct {
		Channels []struct {
			Writer protocol.StreamChannelRef `json:"writer"`
			Reader protocol.StreamChannelRef `json:"reader"`
		} `json:"channels"`
	}
	assert.NilError(t, json.Unmarshal(mustJSON(t, res["result"]), &out), "%v", res)
	assert.Equal(t, len(out.Channels), 3)
	filled, plain, empty := out.Channels[0], out.Channels[1], out.Channels[2]
	assert.Equal(t, te.channels.get(plain.Writer.ChannelID).size, 3)
	ids := map[string]bool{filled.Reader.ChannelID: true, plain.Reader.ChannelID: true, empty.Reader.ChannelID: true}
	assert.Equal(t, len(ids), 3, "distinct channels")
	assert.Equal(t, te.inbound.chanBytes.TryAcquire(ChannelBytesTotal), false, "the content is charged")

	ws := dialChannel(t, te, filled.Writer)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, _, err := ws.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), statusPolicyViolation, "the writer end is used: %v", err)

	rc := dialChannel(t, te, filled.Reader)
	typ, data, err := rc.Read(ctx)
	assert.NilError(t, err)
	assert.Equal(t, typ, websocket.MessageBinary)
	assert.Equal(t, string(data), "hello")
	_, _, err = rc.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusNormalClosure, "%v", err)
	pollUntil(t, "the read channel is forgotten", func() bool { return te.channels.get(filled.Reader.ChannelID) == nil })
	pollUntil(t, "its charge is released", func() bool {
		if te.inbound.chanBytes.TryAcquire(ChannelBytesTotal) {
			te.inbound.chanBytes.Release(ChannelBytesTotal)
			return true
		}
		return false
	})

	re := dialChannel(t, te, empty.Reader)
	_, _, err = re.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusNormalClosure, "an empty stream ends at once: %v", err)

	// The plain one works as a channel made alone.
	pw, pr := dialChannel(t, te, plain.Writer), dialChannel(t, te, plain.Reader)
	assert.NilError(t, pw.Write(ctx, websocket.MessageText, []byte("t")))
	_, data, err = pr.Read(ctx)
	assert.NilError(t, err)
	assert.Equal(t, string(data), "t")
}

func TestChannelCreateBatchValidation(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	big := strings.Repeat("A", (MaxChannelPrefill+3)/3*4+4)
	for _, tc := range []struct{ in, code string }{
		{`{"channels":[]}`, CodeInvalidArgument},
		{`{"channels":[` + strings.TrimSuffix(strings.Repeat(`{},`, MaxChannelBatch+1), ",") + `]}`, CodeInvalidArgument},
		{`{"channels":[{"buffer_size":0}]}`, CodeInvalidArgument},
		{`{"channels":[{"content":"not base64!"}]}`, CodeInvalidArgument},
		{`{"channels":[{"content":"` + big + `"}]}`, CodeInvalidArgument},
		{`{"channels":{}}`, CodeInvalidArgument},
	} {
		res := w.call("v", FnChannelsCreate, nil, tc.in)
		code, msg := errBody(t, res)
		assert.Equal(t, code, tc.code, "input %.80s: %s", tc.in, msg)
	}
	assert.Equal(t, te.channels.len(), 0, "a refused call creates nothing")

	// A batch counts whole against the connection's limit.
	for range MaxChannelsPerConnection/MaxChannelBatch - 1 {
		res := w.call("fill", FnChannelsCreate, nil, `{"channels":[`+strings.TrimSuffix(strings.Repeat(`{},`, MaxChannelBatch), ",")+`]}`)
		assert.Assert(t, res["error"] == nil, "%v", res)
	}
	res := w.call("over", FnChannelsCreate, nil, `{"channels":[`+strings.TrimSuffix(strings.Repeat(`{},`, MaxChannelBatch+0), ",")+`,{}]}`)
	code, _ := errBody(t, res)
	assert.Equal(t, code, CodeInvalidArgument, "17 is over the batch bound")
	res = w.call("over", FnChannelsCreate, nil, `{"channels":[`+strings.TrimSuffix(strings.Repeat(`{},`, MaxChannelBatch), ",")+`]}`)
	assert.Assert(t, res["error"] == nil, "exactly at the limit: %v", res)
	res = w.call("over", FnChannelsCreate, nil, `{"channels":[{}]}`)
	code, _ = errBody(t, res)
	assert.Equal(t, code, CodeLimitExceeded)
}

// TestChannelDropBatch: one drop call removes several channels; refs with a
// wrong key or unknown ids are skipped and counted out.
func TestChannelDropBatch(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	w1, r1 := createChannel(t, w, `{}`)
	w2, _ := createChannel(t, w, `{}`)
	open := dialChannel(t, te, r1)
	in := map[string]any{"channels": []any{w1, map[string]string{"channel_id": w2.ChannelID, "access_key": "wrong"},
		map[string]string{"channel_id": "nope", "access_key": "x"}}}
	res := w.call("drop", FnChannelsDrop, nil, string(mustJSON(t, in)))
	assert.DeepEqual(t, res["result"], map[string]any{"dropped": true, "count": float64(1)})
	assert.Assert(t, te.channels.get(w1.ChannelID) == nil)
	assert.Assert(t, te.channels.get(w2.ChannelID) != nil, "a wrong key drops nothing")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, _, err := open.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), statusGoingAway, "%v", err)

	for _, bad := range []string{`{"channels":[]}`, `{"channels":[{"channel_id":"x"}]}`,
		`{"channels":[` + strings.TrimSuffix(strings.Repeat(`{"channel_id":"x","access_key":"y"},`, MaxChannelDropBatch+1), ",") + `]}`} {
		res := w.call("bad", FnChannelsDrop, nil, bad)
		code, _ := errBody(t, res)
		assert.Equal(t, code, CodeInvalidArgument, "%.60s", bad)
	}
}

// createBatch makes channels with engine::channels::create {channels: [...]}.
func createBatch(t *testing.T, w *rawClient, in string) []protocol.StreamChannelRef {
	t.Helper()
	res := w.call("batch", FnChannelsCreate, nil, in)
	assert.Assert(t, res["error"] == nil, "%v", res)
	var out struct {
		Channels []struct {
			Writer protocol.StreamChannelRef `json:"writer"`
			Reader protocol.StreamChannelRef `json:"reader"`
		} `json:"channels"`
	}
	assert.NilError(t, json.Unmarshal(mustJSON(t, res["result"]), &out), "%v", res)
	readers := make([]protocol.StreamChannelRef, 0, len(out.Channels))
	for _, p := range out.Channels {
		readers = append(readers, p.Reader)
	}
	return readers
}

// chanBudgetFree reports whether nothing is charged to ChannelBytesTotal.
func chanBudgetFree(te *testEngine) bool {
	if te.inbound.chanBytes.TryAcquire(ChannelBytesTotal) {
		te.inbound.chanBytes.Release(ChannelBytesTotal)
		return true
	}
	return false
}

func opened(c *channel) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opened
}

// TestChannelOpenedOnFirstUse: a created channel holds no buffer, room or
// context until an end is opened with its key; one never opened is only
// its table entry and content, and dropping it (or its creator leaving)
// removes both, its charge released. A wrong key opens nothing.
func TestChannelOpenedOnFirstUse(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	refs := createBatch(t, w, `{"channels":[{"content":"aGVsbG8="},{}]}`)
	body, resp := te.channels.get(refs[0].ChannelID), te.channels.get(refs[1].ChannelID)
	assert.Assert(t, body != nil && resp != nil)
	assert.Assert(t, !opened(body) && body.items == nil && body.ctx == nil, "not opened before first use")
	assert.Assert(t, !opened(resp) && resp.items == nil)
	assert.Equal(t, te.channels.owned(w.workerID), 2)
	assert.Assert(t, !chanBudgetFree(te), "the unopened channel's content is charged")

	// A hostile caller with a wrong key (socket or in-process) neither
	// opens nor drops it.
	bad := resp
	badRef := refs[1]
	badRef.AccessKey = "wrong"
	assert.Equal(t, httpStatus(t, channelURL(te, badRef)), http.StatusNotFound)
	_, err := te.OpenChannelReader(badRef)
	assert.Equal(t, err, ErrChannelNotFound)
	other := te.dial(t)
	res := other.call("drop", FnChannelsDrop, nil, string(mustJSON(t, map[string]string{"channel_id": badRef.ChannelID, "access_key": "wrong"})))
	assert.DeepEqual(t, res["result"], map[string]any{"dropped": false})
	assert.Assert(t, !opened(bad), "a refused open does not open it")
	assert.Assert(t, te.channels.get(badRef.ChannelID) == bad)

	// Opening with the right key makes it, content first.
	r, err := te.OpenChannelReader(refs[0])
	assert.NilError(t, err)
	assert.Assert(t, opened(body) && cap(body.items) == defaultChannelBuffer)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	got, err := io.ReadAll(readerCtx{ctx, r})
	assert.NilError(t, err)
	assert.Equal(t, string(got), "hello")
	pollUntil(t, "the read channel is forgotten", func() bool { return te.channels.get(refs[0].ChannelID) == nil })
	assert.Assert(t, chanBudgetFree(te), "its charge is released once read")

	// Never opened and dropped: gone, its slot free, its charge released.
	more := createBatch(t, w, `{"channels":[{"content":"aGk="},{}]}`)
	res = w.call("drop", FnChannelsDrop, nil, string(mustJSON(t, map[string]any{"channels": []any{refs[1], more[0], more[1]}})))
	assert.DeepEqual(t, res["result"], map[string]any{"dropped": true, "count": float64(3)})
	assert.Equal(t, te.channels.len(), 0)
	assert.Equal(t, te.channels.owned(w.workerID), 0)
	assert.Assert(t, chanBudgetFree(te), "a dropped unopened channel's charge is released")
	assert.Equal(t, httpStatus(t, channelURL(te, more[1])), http.StatusNotFound, "a dropped ref opens nothing")

	// Never opened, its creator leaves: gone too.
	createBatch(t, w, `{"channels":[{"content":"aGk="},{}]}`)
	assert.NilError(t, w.c.CloseNow())
	pollUntil(t, "the leaving creator's channels removed", func() bool { return te.channels.len() == 0 })
	assert.Equal(t, te.channels.owned(w.workerID), 0)
	assert.Assert(t, chanBudgetFree(te))
}

// TestChannelSweepUnopened: the TTL sweep removes channels never opened,
// releasing the content they hold.
func TestChannelSweepUnopened(t *testing.T) {
	te := startEngine(t, Options{ChannelTTL: 10 * time.Millisecond, ChannelSweepInterval: 5 * time.Millisecond})
	w := te.dial(t)
	refs := createBatch(t, w, `{"channels":[{"content":"aGVsbG8="},{}]}`)
	pollUntil(t, "unopened channels swept", func() bool { return te.channels.len() == 0 })
	assert.Assert(t, chanBudgetFree(te))
	assert.Equal(t, te.channels.owned(w.workerID), 0)
	assert.Equal(t, httpStatus(t, channelURL(te, refs[0])), http.StatusNotFound)
}

// TestChannelOpenRemoveRace: a channel removed while its ends are being
// opened ends for everyone who took an end (none waits forever), and holds
// no charge afterwards; run with -race.
func TestChannelOpenRemoveRace(t *testing.T) {
	te := startEngine(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for i := range 200 {
		c := te.channels.create(te.Engine, 0, "")
		if i%2 == 0 {
			assert.NilError(t, c.prefill(ctx, []byte("x")))
		}
		wref, rref := c.refs()
		var wg sync.WaitGroup
		wg.Add(3)
		go func() {
			defer wg.Done()
			if r, err := te.OpenChannelReader(rref); err == nil {
				_, _ = io.ReadAll(readerCtx{ctx, r})
				_ = r.Close()
			}
		}()
		go func() {
			defer wg.Done()
			if w, err := te.OpenChannelWriter(wref); err == nil {
				_, _ = w.WriteContext(ctx, []byte("y"))
				_ = w.Close()
			}
		}()
		go func() {
			defer wg.Done()
			te.channels.remove(c)
		}()
		wg.Wait()
	}
	assert.Equal(t, te.channels.len(), 0)
	pollUntil(t, "every charge released", func() bool { return chanBudgetFree(te) })
}

// readerCtx reads r within ctx.
type readerCtx struct {
	ctx context.Context
	r   *ChannelReader
}

func (rc readerCtx) Read(p []byte) (int, error) { return rc.r.ReadContext(rc.ctx, p) }
