package guest

import (
	"context"
	"sync"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// keptOutput routes a kept process's output: to the stream attached to it,
// or, while none is (its host connection ended, an adapter restarts), into
// a bounded backlog the next attach streams first. Around a detach a chunk
// may reach the host twice (it was partly sent), never out of order.
type keptOutput struct {
	// out orders deliveries: a backlog is flushed before live output.
	out sync.Mutex

	mu      sync.Mutex
	att     *attachment
	backlog []keptChunk
	held    int   // bytes in backlog
	dropped int64 // bytes dropped from backlog's front since the last attach
	status  *agentproto.ExitStatus
	err     error
}

type keptChunk struct {
	kind agentproto.Kind
	p    []byte
}

// attachment is one stream a kept process is streamed on.
type attachment struct {
	eio    ExecIO
	ctx    context.Context
	cancel context.CancelFunc
	// gone is closed once the stream is detached (taken over, a send
	// failed, the stream ended).
	gone chan struct{}
	once sync.Once
}

func (a *attachment) end() {
	a.once.Do(func() {
		a.cancel()
		close(a.gone)
	})
}

func (a *attachment) send(kind agentproto.Kind, p []byte) error {
	fn := a.eio.Stdout
	if kind == agentproto.KindStderr {
		fn = a.eio.Stderr
	}
	if fn == nil {
		return nil
	}
	return fn(a.ctx, p)
}

// attach makes a stream the first attachment (the spawn stream).
func (k *keptOutput) attach(ctx context.Context, eio ExecIO) *attachment {
	a := newAttachment(ctx, eio)
	k.mu.Lock()
	k.att = a
	k.mu.Unlock()
	return a
}

func newAttachment(ctx context.Context, eio ExecIO) *attachment {
	actx, cancel := context.WithCancel(ctx)
	return &attachment{eio: eio, ctx: actx, cancel: cancel, gone: make(chan struct{})}
}

// takeOver attaches a new stream: the one attached before ends, the new
// one is told the pid and the dropped count, then gets the backlog.
func (k *keptOutput) takeOver(ctx context.Context, eio ExecIO, pid int) (*attachment, error) {
	a := newAttachment(ctx, eio)
	k.mu.Lock()
	old := k.att
	k.att = nil
	k.mu.Unlock()
	if old != nil {
		// Unblocks a send to a host that no longer reads.
		old.end()
	}
	k.out.Lock()
	defer k.out.Unlock()
	k.mu.Lock()
	backlog, dropped := k.backlog, k.dropped
	k.backlog, k.held, k.dropped = nil, 0, 0
	k.mu.Unlock()
	if eio.Attached != nil {
		eio.Attached(pid, dropped)
	}
	for i, c := range backlog {
		if err := a.send(c.kind, c.p); err != nil {
			a.end()
			k.mu.Lock()
			k.backlog = append(backlog[i:], k.backlog...)
			for _, r := range backlog[i:] {
				k.held += len(r.p)
			}
			k.mu.Unlock()
			return nil, agentproto.Errorf(agentproto.CodeDisconnected, "attach: the stream ended while the kept output was sent: %v", err)
		}
	}
	k.mu.Lock()
	k.att = a
	k.mu.Unlock()
	return a, nil
}

// sink is the Executor's output callback for one kind: it never fails, so
// the process's output is never thrown away while it is kept.
func (k *keptOutput) sink(kind agentproto.Kind) func(context.Context, []byte) error {
	return func(_ context.Context, p []byte) error {
		k.out.Lock()
		defer k.out.Unlock()
		if a := k.current(); a != nil {
			if err := a.send(kind, p); err == nil {
				return nil
			}
			k.detach(a)
		}
		k.hold(kind, p)
		return nil
	}
}

// hold appends to the backlog, dropping its oldest bytes past
// KeptOutputBytes.
func (k *keptOutput) hold(kind agentproto.Kind, p []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(p) > agentproto.KeptOutputBytes {
		k.dropped += int64(len(p) - agentproto.KeptOutputBytes)
		p = p[len(p)-agentproto.KeptOutputBytes:]
	}
	k.backlog = append(k.backlog, keptChunk{kind, p})
	k.held += len(p)
	for k.held > agentproto.KeptOutputBytes {
		first := &k.backlog[0]
		over := k.held - agentproto.KeptOutputBytes
		if over >= len(first.p) {
			k.held -= len(first.p)
			k.dropped += int64(len(first.p))
			k.backlog[0] = keptChunk{}
			k.backlog = k.backlog[1:]
			continue
		}
		first.p = first.p[over:]
		k.held -= over
		k.dropped += int64(over)
	}
}

func (k *keptOutput) current() *attachment {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.att
}

// detach lets a go if it is still the attached stream.
func (k *keptOutput) detach(a *attachment) {
	k.mu.Lock()
	if k.att == a {
		k.att = nil
	}
	k.mu.Unlock()
	a.end()
}

// holds reports whether a is the attached stream.
func (k *keptOutput) holds(a *attachment) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.att == a
}

func (k *keptOutput) finish(status *agentproto.ExitStatus, err error) {
	k.mu.Lock()
	k.status, k.err = status, err
	k.mu.Unlock()
}

func (k *keptOutput) result() (*agentproto.ExitStatus, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.status, k.err
}
