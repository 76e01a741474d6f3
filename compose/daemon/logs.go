package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
)

// compose::logs limits (spec §5.9).
const (
	defaultLogTail = 100
	maxLogTail     = 1000
	maxLogWait     = 5000
	logWaitPoll    = 100 * time.Millisecond
)

type logsJSON struct {
	File       string          `json:"file"`
	Namespace  string          `json:"namespace"`
	Containers []containerLogs `json:"containers"`
}

type containerLogs struct {
	Container string       `json:"container"`
	LogPath   string       `json:"log_path"`
	Entries   []proc.Entry `json:"entries"`
	Cursor    proc.Cursor  `json:"cursor"`
	Truncated bool         `json:"truncated"`
}

func (d *Daemon) fnLogs(ctx context.Context, r *request) (any, error) {
	f, err := d.loadFile(r)
	if err != nil {
		path, cerr := d.canonical(r)
		if cerr != nil {
			return nil, err
		}
		p := d.loadedProject(path)
		if p == nil {
			return nil, err
		}
		f = p.currentFile()
	}
	worker, _, err := stringArg(fnLogs, "worker", r.Worker)
	if err != nil {
		return nil, err
	}
	tail := defaultLogTail
	if r.Tail != nil {
		if *r.Tail < 0 {
			return nil, compose.New(CodeInvalidArgument, "compose::logs: tail must be 0 or more")
		}
		tail = min(*r.Tail, maxLogTail)
	}
	var stream proc.Stream
	if r.Stream != nil {
		switch *r.Stream {
		case "", string(proc.Stdout), string(proc.Stderr):
			stream = proc.Stream(*r.Stream)
		default:
			return nil, compose.New(CodeInvalidArgument, fmt.Sprintf("compose::logs: stream must be stdout or stderr, not %q", *r.Stream))
		}
	}
	wait := time.Duration(0)
	if r.WaitMS != nil {
		if *r.WaitMS < 0 {
			return nil, compose.New(CodeInvalidArgument, "compose::logs: wait_ms must be 0 or more")
		}
		wait = time.Duration(min(*r.WaitMS, maxLogWait)) * time.Millisecond
	}
	keys := f.Order
	if worker != "" {
		if _, ok := f.Containers[worker]; !ok {
			return nil, unknownContainer(f, worker)
		}
		keys = []string{worker}
	}
	dir := filepath.Join(state.DirFor(f.Path, f.Namespace, d.getenv), state.LogsDir)
	// A VM container's log is the adapter's (worker::logs): its output
	// is recorded there, even after the VM is gone.
	vms := map[string]*vmworkers.Ref{}
	p := d.loadedProject(f.Path)
	if p != nil {
		dir = p.store.LogsDir()
		l := p.lockOf(f)
		p.mu.Lock()
		for _, key := range keys {
			if c := p.cs[key]; c != nil && c.vm != nil {
				vms[key] = c.vm
			} else if isVMContainer(f, l, key) {
				vms[key] = d.vmRefFor(f, key)
			}
		}
		p.mu.Unlock()
	} else {
		l, _ := lockfile.Read(lockfile.PathFor(f.Path))
		for _, key := range keys {
			if isVMContainer(f, l, key) {
				vms[key] = d.vmRefFor(f, key)
			}
		}
	}
	read := func() (logsJSON, bool, error) {
		out := logsJSON{File: f.Path, Namespace: f.Namespace, Containers: []containerLogs{}}
		any := false
		for _, key := range keys {
			if ref := vms[key]; ref != nil {
				var cur *proc.Cursor
				if c, ok := r.Cursors[key]; ok {
					cur = &c
				}
				entries, next, truncated, err := d.vms().Logs(ctx, ref, tail, cur, stream)
				if err != nil {
					// The adapter is not running (or knows no such VM):
					// there is nothing to read now.
					d.log.Debug("cannot read a VM worker's log", "container", key, "vm_id", ref.ID, "error", vmworkers.ErrorText(err))
					entries = []proc.Entry{}
				}
				if len(entries) > 0 {
					any = true
				}
				lp := ""
				if p != nil {
					p.mu.Lock()
					if ref.StateDir != "" {
						lp = filepath.Join(ref.StateDir, "worker.log")
					}
					p.mu.Unlock()
				}
				out.Containers = append(out.Containers, containerLogs{Container: key, LogPath: lp, Entries: entries, Cursor: next, Truncated: truncated})
				continue
			}
			opts := proc.ReadOptions{Tail: tail, Stream: stream}
			if cur, ok := r.Cursors[key]; ok {
				c := cur
				opts.Cursor, opts.Limit = &c, maxLogTail
			}
			res, err := proc.ReadLog(dir, key, opts)
			if err != nil {
				return out, false, compose.New(compose.CodeIOError, fmt.Sprintf("read the log of %q in %s: %v", key, dir, err))
			}
			if len(res.Entries) > 0 {
				any = true
			}
			out.Containers = append(out.Containers, containerLogs{Container: key, LogPath: logPath(dir, key),
				Entries: res.Entries, Cursor: res.Cursor, Truncated: res.Truncated})
		}
		return out, any, nil
	}
	out, got, err := read()
	if err != nil || got || wait == 0 || len(r.Cursors) == 0 {
		return out, err
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	t := time.NewTicker(logWaitPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out, nil
		case <-deadline.C:
			return out, nil
		case <-t.C:
		}
		if out, got, err = read(); err != nil || got {
			return out, err
		}
	}
}

// upAtStart brings the --up file up and prints each container's outcome;
// a failure ends with PROJECT_DID_NOT_START (the rollback has already
// stopped what came up).
func (d *Daemon) upAtStart(ctx context.Context, f *composefile.File) error {
	d.applyNamespace(f)
	fmt.Fprintf(d.out, "compose: bringing up %s in namespace %q\n", f.Path, f.Namespace)
	res, err := d.up(ctx, f, "", d.opts.Frozen)
	if err != nil {
		ce := asComposeError(err)
		fmt.Fprintf(d.out, "compose: %s: %s\n", ce.Code, ce.Message)
		return compose.New(compose.CodeProjectDidNotStart, fmt.Sprintf("project %s did not start (%s)", f.Path, ce.Code))
	}
	var firstErr *errorJSON
	var failedKey string
	for _, c := range res.Containers {
		line := fmt.Sprintf("  %-24s %s", c.Container, c.State)
		if c.Error != nil {
			line += "  " + c.Error.Code + ": " + c.Error.Message
			if firstErr == nil {
				firstErr, failedKey = c.Error, c.Container
			}
		}
		fmt.Fprintln(d.out, line)
	}
	if res.Status != "ok" {
		code := "failed"
		if firstErr != nil {
			code = firstErr.Code
		}
		return compose.New(compose.CodeProjectDidNotStart, fmt.Sprintf(
			"project %s did not start: container %q failed with %s; everything this start brought up was stopped", f.Path, failedKey, code))
	}
	fmt.Fprintf(d.out, "compose: project %s is up (%d containers)\n", f.Path, len(res.Containers))
	return nil
}
