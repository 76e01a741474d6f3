package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

// progressTail bounds how long the result waits, after the call returned,
// for the progress channel to end. The plugin host closes it before the
// reply, so the end is normally there already; a function that never
// touches the channel must not hold the result up.
const progressTail = 500 * time.Millisecond

// progressField returns the request property a function's schema marks
// as taking a progress channel (contract.ProgressSchemaMarker), or "".
func progressField(schema json.RawMessage) string {
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return ""
	}
	var found []string
	for name, raw := range s.Properties {
		var p map[string]json.RawMessage
		if json.Unmarshal(raw, &p) != nil {
			continue
		}
		if bytes.Equal(bytes.TrimSpace(p[contract.ProgressSchemaMarker]), []byte("true")) {
			found = append(found, name)
		}
	}
	// One field is what the marker means; several is a schema this CLI
	// does not understand, and progress is not worth guessing for.
	if len(found) != 1 {
		return ""
	}
	return found[0]
}

// withProgressRef returns the payload with key set to ref, or ok false when
// the payload is not a JSON object or already has key (the caller's own
// value wins). Keys keep their order; the new one goes last.
func withProgressRef(data json.RawMessage, key string, ref protocol.StreamChannelRef) (json.RawMessage, bool) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		trimmed = []byte("{}")
	}
	var obj map[string]json.RawMessage
	if trimmed[0] != '{' || json.Unmarshal(trimmed, &obj) != nil {
		return nil, false
	}
	if _, taken := obj[key]; taken {
		return nil, false
	}
	k, err := json.Marshal(key)
	if err != nil {
		return nil, false
	}
	v, err := json.Marshal(ref)
	if err != nil {
		return nil, false
	}
	var b bytes.Buffer
	b.Write(trimmed[:len(trimmed)-1]) // without the closing brace
	if len(obj) > 0 {
		b.WriteByte(',')
	}
	b.Write(k)
	b.WriteByte(':')
	b.Write(v)
	b.WriteByte('}')
	return b.Bytes(), true
}

// progressWatch is a progress channel being read and rendered while a
// call runs.
type progressWatch struct {
	r    *client.ChannelReader
	done chan struct{}
}

// watchProgress prepares fn's call for progress when fn's request schema
// asks for a progress channel and the payload leaves it free: it creates
// the channel, starts rendering its read end on w, and returns the payload
// naming the write end. Without a marked field, or when anything on the
// way fails (an engine that cannot tell, channels refused), the call goes
// ahead as it is: progress is a nicety, never a reason to fail.
func watchProgress(ctx context.Context, c *client.Client, f *callFlags, fn string, ns *string, data json.RawMessage, w io.Writer, terminal bool) (json.RawMessage, *progressWatch) {
	req := map[string]string{"function_id": fn}
	if ns != nil {
		req["namespace"] = *ns
	}
	ictx, cancel := context.WithTimeout(ctx, min(f.timeout(), client.DefaultDialTimeout))
	defer cancel()
	raw, err := c.Call(ictx, fnFunctionsInfo, req, client.WithTimeout(f.timeout()))
	if err != nil {
		return data, nil
	}
	var d functionDetail
	if json.Unmarshal(raw, &d) != nil {
		return data, nil
	}
	key := progressField(d.RequestSchema)
	if key == "" {
		return data, nil
	}
	// The payload is checked before a channel exists, so a caller who
	// set the key leaves nothing behind.
	if _, ok := withProgressRef(data, key, protocol.StreamChannelRef{}); !ok {
		return data, nil
	}
	wref, rref, err := c.CreateChannel(ictx, 0)
	if err != nil {
		return data, nil
	}
	out, _ := withProgressRef(data, key, wref)
	// The reader is attached before the call goes out, so no event is
	// written into a channel nobody reads yet.
	r, err := c.OpenChannelReader(ictx, rref)
	if err != nil {
		return data, nil
	}
	pw := &progressWatch{r: r, done: make(chan struct{})}
	render := newProgressRenderer(w, terminal)
	go func() {
		defer close(pw.done)
		defer render.finish()
		for {
			m, err := r.ReadMessage(context.Background())
			if err != nil {
				return
			}
			if !m.Text {
				continue
			}
			if ev, err := contract.DecodeProgressEvent(m.Data); err == nil {
				render.event(*ev)
			}
		}
	}()
	return out, pw
}

// stop waits (briefly, see progressTail) for the channel to end, then
// releases it; the rendering is complete when stop returns.
func (pw *progressWatch) stop() {
	if pw == nil {
		return
	}
	t := time.NewTimer(progressTail)
	defer t.Stop()
	select {
	case <-pw.done:
	case <-t.C:
	}
	_ = pw.r.Close()
	<-pw.done
}

// progressRenderer draws progress events on w: on a terminal one line per
// phase, redrawn in place while the phase counts bytes; elsewhere (logs,
// CI) a line per phase and, for phases with a known size, one at each
// quarter.
type progressRenderer struct {
	w        io.Writer
	terminal bool

	mu      sync.Mutex
	phase   string // the phase on the current line
	drawn   bool   // a terminal line is open (no newline yet)
	quarter int
}

func newProgressRenderer(w io.Writer, terminal bool) *progressRenderer {
	return &progressRenderer{w: w, terminal: terminal}
}

func (p *progressRenderer) event(ev contract.ProgressEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	name := progressName(ev)
	newPhase := ev.Phase != p.phase
	p.phase = ev.Phase
	if p.terminal {
		if newPhase && p.drawn {
			fmt.Fprint(p.w, "\n")
		}
		// \r and erase-line: a shorter line leaves nothing of the last.
		fmt.Fprintf(p.w, "\r\x1b[K%s", progressLine(name, ev))
		p.drawn = true
		return
	}
	if newPhase {
		p.quarter = 0
		fmt.Fprintln(p.w, progressLine(name, ev))
		return
	}
	if ev.BytesDone != nil && ev.BytesTotal != nil && *ev.BytesTotal > 0 {
		q := int(min(*ev.BytesDone, *ev.BytesTotal) * 4 / *ev.BytesTotal)
		if q > p.quarter {
			p.quarter = q
			fmt.Fprintln(p.w, progressLine(name, ev))
		}
	}
}

// finish ends an open terminal line, so what follows starts on its own.
func (p *progressRenderer) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\n")
		p.drawn = false
	}
}

func progressName(ev contract.ProgressEvent) string {
	switch {
	case ev.Image != "" && ev.ImageRef != "" && ev.ImageRef != ev.Image:
		return fmt.Sprintf("%s (%s)", ev.Image, ev.ImageRef)
	case ev.Image != "":
		return ev.Image
	case ev.ImageRef != "":
		return ev.ImageRef
	}
	return "sandbox"
}

// progressLine is one event in words.
func progressLine(name string, ev contract.ProgressEvent) string {
	verb := map[string]string{
		contract.ProgressPulling:   "pulling",
		contract.ProgressUnpacking: "unpacking",
		contract.ProgressBuilding:  "building the root filesystem",
		contract.ProgressBooting:   "booting the VM",
	}[ev.Phase]
	if verb == "" {
		verb = strings.Join(strings.Fields(ev.Phase), " ")
	}
	if ev.Phase == contract.ProgressReady {
		if ev.SandboxID != "" {
			return fmt.Sprintf("%s: ready, sandbox %s", name, ev.SandboxID)
		}
		return name + ": ready"
	}
	line := name + ": " + verb
	switch {
	case ev.BytesDone != nil && ev.BytesTotal != nil && *ev.BytesTotal > 0:
		done, total := min(*ev.BytesDone, *ev.BytesTotal), *ev.BytesTotal
		const width = 24
		n := int(done * width / total)
		line += fmt.Sprintf(" [%s%s] %3d%% %s of %s", strings.Repeat("=", n), strings.Repeat(" ", width-n),
			done*100/total, humanBytes(done), humanBytes(total))
	case ev.BytesDone != nil:
		line += " " + humanBytes(*ev.BytesDone)
	}
	return line
}

func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
