package pluginhost

import (
	"context"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// A planned replacement of an adapter process (an explicit start taking
// over the adapter config.yaml binds, engine::adapters::restart, Compose
// moving to a new binary) is a hand-over, not an outage:
//   - calls already running on the old process may finish, up to
//     Options.HandoverDrain, before it is stopped;
//   - calls that arrive meanwhile wait for the new process instead of
//     failing with S301;
//   - the adapter's publication in the engine is kept (its functions are
//     re-registered with the new process's handlers, and its worker shows
//     the new PID), so nothing waiting on it is ended.
// A crash is not a hand-over: its calls fail at once with S301.

// DefaultHandoverDrain bounds how long a planned replacement waits for the
// old process's calls (a long exec) before it stops the process; what
// still runs then ends with S301, as in a crash. It is the Kubernetes
// default termination grace.
const DefaultHandoverDrain = 30 * time.Second

// handoverWait bounds how long a call waits for the new process, beyond
// the drain: a start that takes longer is a failure the call hears of.
const handoverWait = 2 * time.Minute

// handover is one planned replacement in progress.
type handover struct {
	done chan struct{} // closed once the new process runs, or did not start
}

// callCount is what one instance is serving, so a hand-over can wait for
// it to reach zero.
type callCount struct {
	mu    sync.Mutex
	n     int
	empty chan struct{} // closed when n drops to zero while someone waits
}

// enter admits a call to in, unless a hand-over has begun: then the call
// waits for the next process instead (ok false).
func (m *managed) enter(in *instance) (ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.handing != nil {
		return false
	}
	in.calls.mu.Lock()
	in.calls.n++
	in.calls.mu.Unlock()
	return true
}

// leave ends a call enter admitted.
func (in *instance) leave() {
	in.calls.mu.Lock()
	defer in.calls.mu.Unlock()
	in.calls.n--
	if in.calls.n == 0 && in.calls.empty != nil {
		close(in.calls.empty)
		in.calls.empty = nil
	}
}

// drained is closed once in serves no call.
func (in *instance) drained() <-chan struct{} {
	in.calls.mu.Lock()
	defer in.calls.mu.Unlock()
	if in.calls.n == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if in.calls.empty == nil {
		in.calls.empty = make(chan struct{})
	}
	return in.calls.empty
}

// beginHandover holds new calls and waits, up to HandoverDrain or ctx, for
// the running process's calls to finish. endHandover must follow, whatever
// happens in between.
func (m *managed) beginHandover(ctx context.Context) {
	m.mu.Lock()
	if m.handing == nil {
		m.handing = &handover{done: make(chan struct{})}
	}
	in := m.current
	m.mu.Unlock()
	if in == nil {
		return
	}
	drain := m.h.opts.HandoverDrain
	t := time.NewTimer(drain)
	defer t.Stop()
	select {
	case <-in.drained():
	case <-t.C:
		m.log.Warn("calls still run on the adapter process being replaced after the drain time; they end with S301", "drain", drain.String())
	case <-ctx.Done():
	}
}

// endHandover lets the held calls go on, to the new process if one runs.
// When no new process was even launched (its binary was not found), the
// publication kept for it is withdrawn, as a stop would.
func (m *managed) endHandover() {
	m.mu.Lock()
	ho := m.handing
	m.handing = nil
	abandoned := m.current == nil && m.status.State == StateStopped
	m.mu.Unlock()
	if abandoned {
		m.unpublish()
	}
	if ho != nil {
		close(ho.done)
	}
}

// handingOver reports whether a hand-over is in progress.
func (m *managed) handingOver() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.handing != nil
}

// admit finds the process that serves a call that found in (nil: the
// adapter was down when it was published) and enters the call there. While
// a hand-over is in progress it waits for the new process. down is the
// answer when no process runs and none is coming.
func (m *managed) admit(ctx context.Context, in *instance, down *contract.Error) (*instance, *contract.Error) {
	for {
		if in != nil && in.ctx.Err() != nil {
			// A call that reached a replaced process's handler just as
			// the new one was published goes to the new one.
			m.mu.Lock()
			if cur := m.current; cur != nil {
				in = cur
			}
			m.mu.Unlock()
		}
		if in != nil && m.enter(in) {
			return in, nil
		}
		m.mu.Lock()
		ho := m.handing
		m.mu.Unlock()
		if ho == nil {
			if in == nil {
				return nil, down
			}
			// The hand-over ended between enter and here: try the
			// process that runs now.
			m.mu.Lock()
			next := m.current
			m.mu.Unlock()
			if next == nil || next == in {
				return nil, m.goneError()
			}
			in = next
			continue
		}
		t := time.NewTimer(handoverWait)
		select {
		case <-ho.done:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return nil, contract.NewError(contract.S301, "sandbox adapter %q in namespace %q is being replaced by a new process; the call ended while it waited: %v",
				m.key.adapter, m.key.ns, context.Cause(ctx))
		case <-t.C:
			return nil, contract.NewError(contract.S301, "sandbox adapter %q in namespace %q is being replaced and its new process did not run within %v; retry",
				m.key.adapter, m.key.ns, handoverWait)
		}
		m.mu.Lock()
		next := m.current
		m.mu.Unlock()
		if next == nil {
			return nil, m.goneError()
		}
		in = next
	}
}

// goneError answers a call whose adapter was replaced and did not come
// back.
func (m *managed) goneError() *contract.Error {
	st := m.snapshot()
	return contract.NewError(contract.S301, "sandbox adapter %q in namespace %q did not come back after it was replaced (state %s): %s",
		m.key.adapter, m.key.ns, st.State, st.LastError)
}
