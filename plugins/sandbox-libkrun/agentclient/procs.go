package agentclient

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Sink takes one chunk of a spawned process's output: kind is
// agentproto.KindStdout or KindStderr. It runs on the Proc's own goroutine,
// one call at a time, and may block: the process's writes wait for it
// (flow control), the connection's other operations do not.
type Sink func(kind agentproto.Kind, p []byte)

// Proc is a supervised process in the guest (agentproto.SpawnRequest).
type Proc struct {
	// PID is the process's pid in the guest.
	PID int
	// Dropped (Attach) is how many bytes of output the agent dropped
	// while no host was attached.
	Dropped int64

	st   *stream
	sink Sink

	mu     sync.Mutex
	chunks []chunk
	sig    chan struct{}
	// drained is closed once every chunk has gone through the sink after
	// the stream ended.
	drained chan struct{}
}

type chunk struct {
	kind agentproto.Kind
	p    []byte
}

// Spawn starts a supervised process and returns once it runs (or failed to
// start). Its output goes to sink until it exits; Wait reports how.
// Canceling ctx before the process started cancels the start; after that,
// ctx no longer matters: Cancel or StopProc end the process. With
// req.Keep (the agent must have CapProcAttach) the process outlives this
// connection: closing it detaches, and Attach on a later connection picks
// the process up again.
func (c *Client) Spawn(ctx context.Context, req agentproto.SpawnRequest, sink Sink) (*Proc, error) {
	if err := c.need(agentproto.CapSpawn, false); err != nil {
		return nil, err
	}
	if req.Keep {
		if err := c.need(agentproto.CapProcAttach, false); err != nil {
			return nil, err
		}
	}
	return c.openProc(ctx, &req, "spawn "+req.Name, sink)
}

// Attach streams the kept process name (spawned with Keep on an earlier
// connection) on this one: the output held while no host was attached
// first (Proc.Dropped says how much older output was lost), then its
// output as it comes; Wait reports its exit, at once if it exited while
// detached. It fails with agentproto.CodeNoProcess when no kept process of
// that name is in the VM.
func (c *Client) Attach(ctx context.Context, name string, sink Sink) (*Proc, error) {
	if err := c.need(agentproto.CapProcAttach, false); err != nil {
		return nil, err
	}
	return c.openProc(ctx, &agentproto.ProcAttachRequest{Name: name}, "attach "+name, sink)
}

// openProc opens a stream that reports Started, then a process's output,
// then its ExitStatus: spawn and proc_attach.
func (c *Client) openProc(ctx context.Context, req agentproto.Message, what string, sink Sink) (*Proc, error) {
	p := &Proc{sink: sink, sig: make(chan struct{}, 1), drained: make(chan struct{})}
	started := make(chan *agentproto.Started, 1)
	st, err := c.open(req,
		func(m agentproto.Message) {
			if s, ok := m.(*agentproto.Started); ok {
				select {
				case started <- s:
				default:
				}
			}
		},
		func(_ *stream, kind agentproto.Kind, b []byte) {
			if len(b) == 0 || (kind != agentproto.KindStdout && kind != agentproto.KindStderr) {
				return
			}
			p.mu.Lock()
			p.chunks = append(p.chunks, chunk{kind, b})
			p.mu.Unlock()
			select {
			case p.sig <- struct{}{}:
			default:
			}
		})
	if err != nil {
		return nil, err
	}
	p.st = st
	go p.pump()
	select {
	case s := <-started:
		p.PID, p.Dropped = s.PID, s.DroppedBytes
		return p, nil
	case <-st.done:
		select {
		case s := <-started:
			// Started and a quick exit arrived together.
			p.PID, p.Dropped = s.PID, s.DroppedBytes
			return p, nil
		default:
		}
		<-p.drained
		if st.err != nil {
			return nil, st.err
		}
		if _, ok := st.terminal.(*agentproto.ExitStatus); ok {
			// The program could not be run (127/126, as a shell says):
			// an exit, which Wait reports.
			return p, nil
		}
		return nil, agentproto.Errorf(agentproto.CodeProtocol, "%s ended before it started", what)
	case <-ctx.Done():
		st.cancel()
		<-p.drained
		return nil, ctx.Err()
	}
}

// pump hands chunks to the sink and returns their credit, until the
// stream has ended and nothing is left.
func (p *Proc) pump() {
	defer close(p.drained)
	for {
		p.mu.Lock()
		if len(p.chunks) > 0 {
			ch := p.chunks[0]
			p.chunks[0] = chunk{}
			p.chunks = p.chunks[1:]
			p.mu.Unlock()
			if p.sink != nil {
				p.sink(ch.kind, ch.p)
			}
			p.st.grant(len(ch.p))
			continue
		}
		p.mu.Unlock()
		select {
		case <-p.sig:
		case <-p.st.done:
			p.mu.Lock()
			left := len(p.chunks)
			p.mu.Unlock()
			if left == 0 {
				return
			}
		}
	}
}

// Done is closed once the process has ended and all its output went
// through the sink.
func (p *Proc) Done() <-chan struct{} { return p.drained }

// Wait waits for the process to end and its output to be delivered, and
// returns its exit status. An error means the stream broke (the agent
// connection ended) or ctx ended first; the process may then still run.
func (p *Proc) Wait(ctx context.Context) (*agentproto.ExitStatus, error) {
	select {
	case <-p.drained:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if p.st.err != nil {
		return nil, p.st.err
	}
	es, ok := p.st.terminal.(*agentproto.ExitStatus)
	if !ok {
		return nil, agentproto.Errorf(agentproto.CodeProtocol, "spawn ended with %q", messageType(p.st.terminal))
	}
	return es, nil
}

// Cancel kills the process's whole tree at once (a kept one too).
func (p *Proc) Cancel() { p.st.cancel() }

func messageType(m agentproto.Message) string {
	if m == nil {
		return "nothing"
	}
	return m.MessageType()
}

// StopProc stops the spawned process name: SIGTERM, grace, SIGKILL. It
// returns once the process is gone; Stopped is false when none ran.
func (c *Client) StopProc(ctx context.Context, name string, grace int64) (*agentproto.ProcStopResult, error) {
	if err := c.need(agentproto.CapSpawn, false); err != nil {
		return nil, err
	}
	st, err := c.open(&agentproto.ProcStopRequest{Name: name, GraceMS: grace}, nil, nil)
	if err != nil {
		return nil, err
	}
	m, err := st.wait(ctx)
	if err != nil {
		return nil, err
	}
	var res agentproto.ProcStopResult
	return &res, decodeResult(m, &res)
}

// Workspace streams the tar archive r into req.Dir in the guest (see
// agentproto.WorkspaceRequest).
func (c *Client) Workspace(ctx context.Context, req agentproto.WorkspaceRequest, r io.Reader) (*agentproto.WorkspaceResult, error) {
	if err := c.need(agentproto.CapWorkspace, false); err != nil {
		return nil, err
	}
	st, err := c.open(&req, nil, nil)
	if err != nil {
		return nil, err
	}
	srcErr := make(chan error, 1)
	go func() {
		_, err := st.sendData(ctx, agentproto.KindFile, r)
		if err != nil && !errors.Is(err, errStreamEnded) && ctx.Err() == nil {
			// A broken source must not look like a short archive.
			st.abort(agentproto.Errorf(agentproto.CodeFSAborted, "workspace %s: reading the archive failed: %v", req.Dir, err))
		}
		srcErr <- err
	}()
	m, err := st.wait(ctx)
	// The sender stops once the stream has ended (its window closes).
	<-srcErr
	if err != nil {
		return nil, err
	}
	var res agentproto.WorkspaceResult
	return &res, decodeResult(m, &res)
}
