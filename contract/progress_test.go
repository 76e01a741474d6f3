package contract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

func TestProgressEventJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		ev   ProgressEvent
		want string
	}{
		{"pulling with a total",
			ProgressEvent{Phase: ProgressPulling, Image: "python", ImageRef: "docker.io/iiidev/python:latest"}.WithBytes(5, 10),
			`{"phase":"pulling","image":"python","image_ref":"docker.io/iiidev/python:latest","bytes_done":5,"bytes_total":10}`},
		{"unknown total is left out",
			ProgressEvent{Phase: ProgressBuilding, Image: "node", ImageRef: "r"}.WithBytes(0, 0),
			`{"phase":"building","image":"node","image_ref":"r","bytes_done":0}`},
		{"a phase without bytes",
			ProgressEvent{Phase: ProgressBooting, Image: "node", ImageRef: "r"},
			`{"phase":"booting","image":"node","image_ref":"r"}`},
		{"ready names the sandbox",
			ProgressEvent{Phase: ProgressReady, Image: "node", ImageRef: "r", SandboxID: sid},
			`{"phase":"ready","image":"node","image_ref":"r","sandbox_id":"` + sid + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodeJSON(tc.ev)
			assert.NilError(t, err)
			assert.Equal(t, string(b), tc.want)
			back, err := DecodeProgressEvent(b)
			assert.NilError(t, err)
			assert.DeepEqual(t, *back, tc.ev)
		})
	}
}

func TestDecodeProgressEvent(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     *ProgressEvent
		err      string
	}{
		{name: "minimal", in: `{"phase":"booting"}`, want: &ProgressEvent{Phase: ProgressBooting}},
		{name: "a newer phase is kept", in: ` {"phase":"verifying","extra":[1]} `, want: &ProgressEvent{Phase: "verifying"}},
		{name: "not an object", in: `["phase"]`, err: "want a JSON object, got an array"},
		{name: "empty", in: ``, err: "want a JSON object, got nothing"},
		{name: "no phase", in: `{"image":"python"}`, err: "no phase"},
		{name: "negative bytes", in: `{"phase":"pulling","bytes_done":-1}`, err: "progress event"},
		{name: "fractional bytes", in: `{"phase":"pulling","bytes_total":1.5}`, err: "progress event"},
		{name: "phase of the wrong type", in: `{"phase":3}`, err: "progress event"},
		{name: "broken JSON", in: `{"phase":"pulling"`, err: "progress event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeProgressEvent([]byte(tc.in))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				assert.Check(t, got == nil)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

// FuzzDecodeProgressEvent: no input panics, and an accepted event survives
// its own encoding.
func FuzzDecodeProgressEvent(f *testing.F) {
	f.Add([]byte(`{"phase":"pulling","image":"python","image_ref":"r","bytes_done":1,"bytes_total":2}`))
	f.Add([]byte(`{"phase":"ready","sandbox_id":"x"}`))
	f.Add([]byte(`{"phase":""}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := DecodeProgressEvent(data)
		if err != nil {
			if ev != nil {
				t.Fatal("an event came back with an error")
			}
			return
		}
		b, err := EncodeJSON(ev)
		if err != nil {
			t.Fatalf("encode %#v: %v", ev, err)
		}
		again, err := DecodeProgressEvent(b)
		if err != nil {
			t.Fatalf("re-encoded event %s refused: %v", b, err)
		}
		if ev.Phase != again.Phase || ev.Image != again.Image || ev.ImageRef != again.ImageRef || ev.SandboxID != again.SandboxID {
			t.Fatalf("round trip changed %#v into %#v", ev, again)
		}
	})
}

// The progress field of create and run: either end of a channel, always
// handed on as the write end; anything else is S001 naming the field.
func TestDecodeProgressField(t *testing.T) {
	ref := func(dir string) string {
		return `{"channel_id":"c1","access_key":"k1","direction":"` + dir + `"}`
	}
	want := &protocol.StreamChannelRef{ChannelID: "c1", AccessKey: "k1", Direction: protocol.DirectionWrite}
	for _, tc := range []struct {
		name, progress string
		want           *protocol.StreamChannelRef
		err            string
	}{
		{name: "absent", progress: ``},
		{name: "null", progress: `null`},
		{name: "the write end", progress: ref("write"), want: want},
		{name: "the read end", progress: ref("read"), want: want},
		{name: "a string", progress: `"c1"`, err: `field "progress" must be a channel ref object`},
		{name: "no access key", progress: `{"channel_id":"c1","direction":"write"}`, err: "progress.access_key must be a non-empty string"},
		{name: "a bad direction", progress: ref("both"), err: `progress.direction must be "write" or "read", got "both"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			field := ""
			if tc.progress != "" {
				field = `,"progress":` + tc.progress
			}
			create, cerr := DecodeCreateRequest(json.RawMessage(`{"image":"python"` + field + `}`))
			run, rerr := DecodeRunRequest(json.RawMessage(`{"image":"python","code":"","lang":"sh"` + field + `}`))
			if tc.err != "" {
				for _, err := range []error{cerr, rerr} {
					var e *Error
					assert.Assert(t, errors.As(err, &e), "%v", err)
					assert.Equal(t, e.Code, S001)
					assert.Check(t, is.Contains(e.Message, tc.err))
				}
				return
			}
			assert.NilError(t, cerr)
			assert.NilError(t, rerr)
			assert.DeepEqual(t, create.Progress, tc.want)
			assert.DeepEqual(t, run.Progress, tc.want)
		})
	}
}

func TestProgressContext(t *testing.T) {
	ctx := context.Background()
	assert.Check(t, ProgressFrom(ctx) == nil)
	ReportProgress(ctx, ProgressEvent{Phase: ProgressBooting}) // no sink: nothing happens

	var got []string
	ctx = WithProgress(ctx, func(ev ProgressEvent) { got = append(got, ev.Phase) })
	ReportProgress(ctx, ProgressEvent{Phase: ProgressBooting})
	ReportProgress(ctx, ProgressEvent{Phase: ProgressReady})
	assert.DeepEqual(t, got, []string{ProgressBooting, ProgressReady})
}

// gate is a send function that blocks until released, recording what it
// sent.
type gate struct {
	mu      sync.Mutex
	sent    []ProgressEvent
	entered chan struct{}
	release chan struct{}
	fail    error
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (g *gate) send(ctx context.Context, ev ProgressEvent) error {
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sent = append(g.sent, ev)
	return g.fail
}

func (g *gate) phases() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, ev := range g.sent {
		s := ev.Phase
		if ev.BytesDone != nil {
			s += fmt.Sprint(":", *ev.BytesDone)
		}
		out = append(out, s)
	}
	return out
}

// closeRelay closes r, which drains it first: the test fails if that
// hangs.
func closeRelay(t *testing.T, r *ProgressRelay) {
	t.Helper()
	waitfor.Func(t, waitfor.Default, "the progress relay to drain and close", func() { r.Close(context.Background()) })
}

func pulled(n uint64) ProgressEvent {
	return ProgressEvent{Phase: ProgressPulling}.WithBytes(n, 100)
}

func TestProgressRelay(t *testing.T) {
	t.Run("coalesces a phase while the consumer is busy, keeps every phase change", func(t *testing.T) {
		g := newGate()
		r := NewProgressRelay(g.send)
		r.Report(pulled(1))
		waitfor.Recv(t, g.entered, waitfor.Default, "pulled:1 to be sent") // the rest queue up
		for n := uint64(2); n <= 50; n++ {
			r.Report(pulled(n))
		}
		r.Report(ProgressEvent{Phase: ProgressUnpacking})
		r.Report(ProgressEvent{Phase: ProgressBooting})
		r.Report(ProgressEvent{Phase: ProgressReady})
		close(g.release)
		closeRelay(t, r)
		assert.DeepEqual(t, g.phases(), []string{"pulling:1", "pulling:50", ProgressUnpacking, ProgressBooting, ProgressReady})
	})

	t.Run("a bounded queue keeps the newest", func(t *testing.T) {
		g := newGate()
		r := NewProgressRelay(g.send)
		r.Report(ProgressEvent{Phase: "p-start"})
		waitfor.Recv(t, g.entered, waitfor.Default, "the first send")
		for i := range 2 * maxPendingProgress {
			r.Report(ProgressEvent{Phase: fmt.Sprint("p", i)})
		}
		close(g.release)
		closeRelay(t, r)
		got := g.phases()
		assert.Equal(t, len(got), 1+maxPendingProgress)
		assert.Equal(t, got[len(got)-1], fmt.Sprint("p", 2*maxPendingProgress-1))
	})

	t.Run("close gives up on a stuck consumer", func(t *testing.T) {
		g := newGate() // never released
		r := NewProgressRelay(g.send)
		r.Report(ProgressEvent{Phase: ProgressBooting})
		r.Report(ProgressEvent{Phase: ProgressReady})
		waitfor.Recv(t, g.entered, waitfor.Default, "the first send")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		r.Close(ctx) // returns: the send saw its context end
		assert.Check(t, is.Len(g.phases(), 0))
		r.Report(ProgressEvent{Phase: ProgressReady}) // after Close: dropped, no panic
		closeRelay(t, r)
	})

	t.Run("a failed send drops the rest", func(t *testing.T) {
		g := newGate()
		g.fail = errors.New("the reader left")
		close(g.release)
		r := NewProgressRelay(g.send)
		r.Report(ProgressEvent{Phase: ProgressPulling})
		waitfor.Recv(t, g.entered, waitfor.Default, "the first send")
		r.Report(ProgressEvent{Phase: ProgressBooting})
		r.Report(ProgressEvent{Phase: ProgressReady})
		closeRelay(t, r)
		got := g.phases()
		assert.Assert(t, len(got) >= 1 && len(got) <= 2, "%v", got)
		assert.Equal(t, got[0], ProgressPulling)
	})

	t.Run("close with nothing reported", func(t *testing.T) {
		r := NewProgressRelay(newGate().send)
		closeRelay(t, r)
	})
}
