package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// QMPName is the QMP control socket in StateDir of a VM launched with
// Control (templates are recorded and restored through it).
const QMPName = "qmp.sock"

// maxQMPLine bounds one QMP message. QEMU is trusted (it is our child, not
// the guest), but a bound keeps a broken one from growing the buffer.
const maxQMPLine = 1 << 20

// QMP is a connection to QEMU's machine protocol. Commands are run one at
// a time; asynchronous events are skipped.
type QMP struct {
	conn net.Conn
	rd   *bufio.Scanner
}

// QMPError is an error QEMU returned for a command.
type QMPError struct {
	Command string
	Class   string
	Desc    string
}

func (e *QMPError) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// DialQMP connects to a QMP socket and leaves capability negotiation mode.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
	}
	q := &QMP{conn: conn, rd: bufio.NewScanner(conn)}
	q.rd.Buffer(make([]byte, 0, 4096), maxQMPLine)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	// The greeting first, then capabilities negotiation.
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := q.read(&greeting); err != nil || greeting.QMP == nil {
		_ = conn.Close()
		return nil, fmt.Errorf("qmp: no greeting from %s: %v", path, err)
	}
	if err := q.exec("qmp_capabilities", nil, nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return q, nil
}

// Close closes the connection.
func (q *QMP) Close() error { return q.conn.Close() }

// Execute runs one command with args (nil for none) and decodes its
// return value into out (nil to ignore it). ctx bounds the round trip.
func (q *QMP) Execute(ctx context.Context, command string, args, out any) error {
	stop := context.AfterFunc(ctx, func() { _ = q.conn.SetDeadline(time.Now()) })
	defer stop()
	err := q.exec(command, args, out)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("qmp %s: %w", command, ctx.Err())
	}
	return err
}

func (q *QMP) exec(command string, args, out any) error {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("qmp %s: write: %w", command, err)
	}
	for {
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := q.read(&resp); err != nil {
			return fmt.Errorf("qmp %s: %w", command, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return &QMPError{Command: command, Class: resp.Error.Class, Desc: resp.Error.Desc}
		case resp.Return == nil:
			continue
		}
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(resp.Return, out); err != nil {
			return fmt.Errorf("qmp %s: decode the reply: %w", command, err)
		}
		return nil
	}
}

func (q *QMP) read(v any) error {
	if !q.rd.Scan() {
		if err := q.rd.Err(); err != nil {
			return err
		}
		return errors.New("connection closed")
	}
	return json.Unmarshal(q.rd.Bytes(), v)
}

// MigrationStatus is query-migrate's status: "completed", "failed",
// "active" and so on.
func (q *QMP) MigrationStatus(ctx context.Context) (status, errDesc string, err error) {
	var info struct {
		Status    string `json:"status"`
		ErrorDesc string `json:"error-desc"`
	}
	if err := q.Execute(ctx, "query-migrate", nil, &info); err != nil {
		return "", "", err
	}
	return info.Status, info.ErrorDesc, nil
}

// WaitMigration polls query-migrate until the migration completed (nil)
// or failed (an error).
func (q *QMP) WaitMigration(ctx context.Context) error {
	delay := time.Millisecond
	for {
		status, desc, err := q.MigrationStatus(ctx)
		if err != nil {
			return err
		}
		switch status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", status, desc)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("migration still %q: %w", status, ctx.Err())
		case <-t.C:
		}
		delay = min(delay*2, 20*time.Millisecond)
	}
}

// setIgnoreShared turns on x-ignore-shared: RAM in a shared memory backend
// is not sent, since the memory file already holds it.
func (q *QMP) setIgnoreShared(ctx context.Context) error {
	return q.Execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}},
	}, nil)
}
