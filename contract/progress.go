package contract

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/iii-sandbox/iii/internal/jsonkind"
)

// Progress of sandbox::create and sandbox::run (contract 1.1, additive).
//
// A caller that wants to watch a slow create (a cold image pull takes
// seconds to minutes) passes "progress": a channel ref. The host writes one
// JSON text message per ProgressEvent into that channel while the call
// runs, and closes it before the call's result goes out. Adapters report
// events through the context (ReportProgress); the transport between host
// and adapter (the CreateStream and RunStream RPCs) is invisible to them.
// An adapter that reports nothing still works: the channel is closed
// without events. Events are advisory: a caller never needs them to
// interpret the result, and bytes-counting events may be coalesced (only
// the latest of a run of same-phase events is guaranteed to arrive).

// Progress phases, in the order a cold create goes through them. A create
// from a cached image starts at booting.
const (
	// ProgressPulling: the image's layers are being downloaded
	// (bytes_done of bytes_total compressed bytes).
	ProgressPulling = "pulling"
	// ProgressUnpacking: the layers are being unpacked (bytes of the
	// compressed layers read so far).
	ProgressUnpacking = "unpacking"
	// ProgressBuilding: the unpacked root is being turned into the
	// block image VMs boot (bytes of the root filesystem).
	ProgressBuilding = "building"
	// ProgressBooting: the sandbox's VM is starting.
	ProgressBooting = "booting"
	// ProgressReady: the sandbox is up; sandbox_id names it.
	ProgressReady = "ready"
)

// ProgressPhases lists the phases in order. It returns a fresh slice.
func ProgressPhases() []string {
	return []string{ProgressPulling, ProgressUnpacking, ProgressBuilding, ProgressBooting, ProgressReady}
}

// ProgressField is the request field of sandbox::create and sandbox::run
// that carries the progress channel, and ProgressSchemaMarker the JSON
// Schema keyword that marks it (`iii call` finds the field by it).
const (
	ProgressField        = "progress"
	ProgressSchemaMarker = "x-iii-progress"
)

// ProgressEvent is one progress report, written to the caller's channel as
// a JSON text message {phase, image, image_ref, bytes_done?, bytes_total?,
// sandbox_id?}. Image is the catalog name the request named, ImageRef the
// OCI reference it stands for. The byte counts are absent when the phase
// does not count bytes (or the total is not known yet).
type ProgressEvent struct {
	Phase      string  `json:"phase"`
	Image      string  `json:"image"`
	ImageRef   string  `json:"image_ref"`
	BytesDone  *uint64 `json:"bytes_done,omitempty"`
	BytesTotal *uint64 `json:"bytes_total,omitempty"`
	// SandboxID is set on the ready event.
	SandboxID string `json:"sandbox_id,omitempty"`
}

// WithBytes returns ev counting done bytes of total; a total of 0 means
// unknown and is left out.
func (ev ProgressEvent) WithBytes(done, total uint64) ProgressEvent {
	ev.BytesDone = &done
	ev.BytesTotal = nil
	if total > 0 {
		ev.BytesTotal = &total
	}
	return ev
}

// maxProgressEvent bounds a progress message a reader accepts: events are
// a few hundred bytes, anything much larger is not one.
const maxProgressEvent = 64 << 10

// DecodeProgressEvent parses one progress message. Unknown fields are
// ignored and an unknown phase is kept as it is (a newer adapter may report
// more phases); a message that is not an object, lacks a phase, or has a
// field of the wrong type is an error.
func DecodeProgressEvent(raw []byte) (*ProgressEvent, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > maxProgressEvent {
		return nil, fmt.Errorf("progress event: %d bytes is more than %d", len(raw), maxProgressEvent)
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, fmt.Errorf("progress event: want a JSON object, got %s", jsonkind.Of(raw))
	}
	var ev ProgressEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, fmt.Errorf("progress event: %w", err)
	}
	if ev.Phase == "" {
		return nil, errors.New("progress event: no phase")
	}
	return &ev, nil
}

// ProgressSink receives progress events. It must be safe for concurrent
// use and must not block: reporters call it from the middle of their work
// (an image pull's read loop).
type ProgressSink func(ProgressEvent)

type progressKey struct{}

// WithProgress returns ctx carrying sink: ReportProgress calls under it
// reach sink. Hosts and the gRPC server put it there; adapters only
// report.
func WithProgress(ctx context.Context, sink ProgressSink) context.Context {
	return context.WithValue(ctx, progressKey{}, sink)
}

// ProgressFrom returns the sink ctx carries, or nil when the caller did
// not ask for progress.
func ProgressFrom(ctx context.Context) ProgressSink {
	s, _ := ctx.Value(progressKey{}).(ProgressSink)
	return s
}

// ReportProgress hands ev to the sink ctx carries; without one it does
// nothing, so adapters report unconditionally.
func ReportProgress(ctx context.Context, ev ProgressEvent) {
	if s := ProgressFrom(ctx); s != nil {
		s(ev)
	}
}

// maxPendingProgress bounds the events a relay holds for a slow consumer.
// Consecutive same-phase events are coalesced, so only a pathological
// reporter (phases alternating thousands of times) reaches it.
const maxPendingProgress = 64

// ProgressRelay carries progress events from reporters, which must never
// wait, to a consumer that may be slow or stuck (a gRPC stream under flow
// control, a channel nobody reads). Report queues and returns at once; one
// goroutine hands queued events to send in order. While send is busy, a
// newer event of the same phase replaces the queued one, so the queue
// holds little more than the phase changes, none of which is lost.
type ProgressRelay struct {
	send func(context.Context, ProgressEvent) error
	// ctx is what send gets; Close cancels it when the drain takes too
	// long.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	pending []ProgressEvent
	closed  bool // no more events are accepted
	failed  bool // send failed: the consumer is gone, drop everything

	wake chan struct{}
	done chan struct{}
}

// NewProgressRelay starts a relay that calls send for each event, one at a
// time. send should return once its context ends. Close stops the relay.
func NewProgressRelay(send func(context.Context, ProgressEvent) error) *ProgressRelay {
	ctx, cancel := context.WithCancel(context.Background())
	r := &ProgressRelay{send: send, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go r.run()
	return r
}

// Report queues ev; it never blocks. Events after Close, or after send
// failed, are dropped.
func (r *ProgressRelay) Report(ev ProgressEvent) {
	r.mu.Lock()
	switch n := len(r.pending); {
	case r.closed || r.failed:
	case n > 0 && (r.pending[n-1].Phase == ev.Phase || n >= maxPendingProgress):
		r.pending[n-1] = ev
	default:
		r.pending = append(r.pending, ev)
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *ProgressRelay) run() {
	defer close(r.done)
	for {
		r.mu.Lock()
		if len(r.pending) == 0 || r.failed {
			closed := r.closed
			r.pending = nil
			r.mu.Unlock()
			if closed {
				return
			}
			select {
			case <-r.wake:
			case <-r.ctx.Done():
				return
			}
			continue
		}
		ev := r.pending[0]
		r.pending = r.pending[1:]
		r.mu.Unlock()
		if err := r.send(r.ctx, ev); err != nil {
			r.mu.Lock()
			r.failed = true
			r.mu.Unlock()
		}
	}
}

// Close stops accepting events and waits until the queued ones are sent.
// When ctx ends first, the send under way is cancelled and the rest
// dropped. Close returns once the relay's goroutine has ended, so the
// consumer is free for the caller (e.g. to send a final message). It may
// be called more than once.
func (r *ProgressRelay) Close(ctx context.Context) {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		r.cancel()
		<-r.done
	}
	r.cancel()
}
