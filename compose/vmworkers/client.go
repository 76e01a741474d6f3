package vmworkers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

const (
	// CallTimeout bounds the quick worker::* calls (status, logs).
	CallTimeout = 30 * time.Second
	// StopMargin is added to stop_timeout for worker::stop: the adapter
	// also powers the VM off after the grace.
	StopMargin = 30 * time.Second
	// logTailLines is how much of worker::logs a start failure quotes:
	// the adapter's own notes (copy, install, exit) come with the output.
	logTailLines = 10
)

// Caller is what the client needs of the engine connection
// (*client.Client).
type Caller interface {
	Call(ctx context.Context, functionID string, payload any, opts ...client.CallOption) (json.RawMessage, error)
}

// Client calls <adapter>::worker::* through the engine.
type Client struct {
	Eng Caller
}

// Call calls <adapter>::<op> in the adapter's namespace.
func (c Client) Call(ctx context.Context, a *Adapter, op string, req any, timeout time.Duration) (json.RawMessage, error) {
	return c.Eng.Call(ctx, a.Name+"::"+op, req, client.WithNamespace(a.NS), client.WithTimeout(timeout))
}

// Status is worker::status of ref.
func (c Client) Status(ctx context.Context, ref *Ref) (*contract.WorkerStatus, error) {
	raw, err := c.Call(ctx, ref.Adapter, contract.OpWorkerStatus, contract.WorkerStatusRequest{VMID: ref.ID}, CallTimeout)
	if err != nil {
		return nil, err
	}
	var st contract.WorkerStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("%s::%s returned an unexpected reply: %v", ref.Adapter.Name, contract.OpWorkerStatus, err)
	}
	return &st, nil
}

// Logs reads worker::logs of ref as compose::logs entries: the adapter's
// own notes (stream system) come as stderr lines prefixed with the
// adapter's name. A cursor is {generation: 0, offset: the seq of the last
// entry read}.
func (c Client) Logs(ctx context.Context, ref *Ref, tail int, cur *proc.Cursor, stream proc.Stream) ([]proc.Entry, proc.Cursor, bool, error) {
	req := contract.WorkerLogsRequest{VMID: ref.ID, Tail: uint64(max(tail, 1))}
	if cur != nil {
		seq := uint64(max(cur.Offset, 0))
		req.Cursor, req.Tail = &seq, contract.MaxWorkerLogsTail
	}
	next := proc.Cursor{}
	if cur != nil {
		next = *cur
	}
	raw, err := c.Call(ctx, ref.Adapter, contract.OpWorkerLogs, req, CallTimeout)
	if err != nil {
		return nil, next, false, err
	}
	var rep contract.WorkerLogsResponse
	if err := json.Unmarshal(raw, &rep); err != nil {
		return nil, next, false, fmt.Errorf("%s::%s returned an unexpected reply: %v", ref.Adapter.Name, contract.OpWorkerLogs, err)
	}
	entries := []proc.Entry{}
	if tail > 0 || cur != nil {
		for _, e := range rep.Entries {
			s, msg := proc.Stream(e.Stream), e.Message
			if e.Stream != contract.LogStdout && e.Stream != contract.LogStderr {
				s, msg = proc.Stderr, "["+ref.Adapter.Name+"] "+msg
			}
			if stream != "" && s != stream {
				continue
			}
			entries = append(entries, proc.Entry{Stream: s, Message: msg})
		}
	}
	return entries, proc.Cursor{Offset: int64(rep.Cursor)}, rep.Truncated, nil
}

// Tail formats the last lines of worker::logs for a message ("" when
// there are none or they cannot be read).
func (c Client) Tail(ctx context.Context, ref *Ref) string {
	entries, _, _, err := c.Logs(ctx, ref, logTailLines, nil, "")
	if err != nil || len(entries) == 0 {
		return ""
	}
	lines := make([]string, 0, len(entries))
	for _, e := range entries {
		lines = append(lines, clip(e.Message, 400))
	}
	return "; last output:\n  " + strings.Join(lines, "\n  ")
}

// Ended reports a worker::status state in which the command no longer runs.
func Ended(s string) bool {
	return s == contract.WorkerExited || s == contract.WorkerFailed || s == contract.WorkerStopped
}

// EndText says how a worker VM's command ended.
func EndText(st *contract.WorkerStatus) string {
	var b strings.Builder
	switch st.State {
	case contract.WorkerExited:
		b.WriteString("exited")
	case contract.WorkerStopped:
		b.WriteString("was stopped by its adapter")
	default:
		b.WriteString("failed")
	}
	if st.ExitCode != nil {
		fmt.Fprintf(&b, " (status %d)", *st.ExitCode)
	}
	if st.LastError != "" {
		b.WriteString(": " + clip(st.LastError, 400))
	}
	return b.String()
}

// CallFailed is SPAWN_FAILED for a worker::* call the adapter refused,
// carrying its S-code and message (S501 names the host roots and how to
// restart the adapter).
func CallFailed(key string, ref *Ref, op, what string, err error) error {
	return compose.New(compose.CodeSpawnFailed, fmt.Sprintf("container %q: %s::%s in namespace %q %s: %s",
		key, ref.Adapter.Name, op, ref.Adapter.NS, what, ErrorText(err)))
}

// CodeOf is the S-code of an adapter's error ("" for another error).
func CodeOf(err error) string {
	var eb *protocol.ErrorBody
	if !errors.As(err, &eb) {
		return ""
	}
	if se, ok := contract.FromErrorBody(eb); ok {
		return string(se.Code)
	}
	return eb.Code
}

// ErrorText words an adapter's error as "S501: message".
func ErrorText(err error) string {
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		if se, ok := contract.FromErrorBody(eb); ok {
			return string(se.Code) + ": " + se.Message
		}
		return eb.Code + ": " + eb.Message
	}
	return err.Error()
}

// clip shortens s for a message.
func clip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
