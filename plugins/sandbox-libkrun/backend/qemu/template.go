package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// A snapshot template is a booted VM saved once with its agent ready: its
// RAM in a memory file (the VM ran with MemoryShared, so the file is the
// RAM) and its device state in a state file (QEMU's migration stream with
// x-ignore-shared, so the RAM is not in it). A clone maps the memory file
// copy-on-write and loads the device state: it resumes where the template
// stopped, without booting, and shares the untouched pages with every
// other clone through the host's page cache.
//
// Both halves must come from the same save and be used with the same
// command line (kernel, initrd, disks, devices, memory, cpus): the caller
// keys templates by all of it.

// restoreTimeout bounds loading a template's device state.
const restoreTimeout = 30 * time.Second

// restore feeds the saved device state to a QEMU started with
// "-incoming defer" and waits until the VM runs.
func (vm *VM) restore(ctx context.Context, cfg Config) error {
	rctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	q, err := dialQMPWhenReady(rctx, vm, filepath.Join(cfg.StateDir, QMPName))
	if err != nil {
		return vm.failure(CodeStartFailed, "restore: "+err.Error())
	}
	defer q.Close()
	if err := q.setIgnoreShared(rctx); err != nil {
		return vm.failure(CodeStartFailed, "restore: "+err.Error())
	}
	if err := q.Execute(rctx, "migrate-incoming", map[string]any{"uri": "fd:" + strconv.Itoa(cfg.incomingFD())}, nil); err != nil {
		return vm.failure(CodeStartFailed, "restore: "+err.Error())
	}
	if err := q.WaitMigration(rctx); err != nil {
		return vm.failure(CodeStartFailed, "restore: "+err.Error())
	}
	// The VM starts running once the state is loaded (QEMU's autostart).
	return waitRunning(rctx, q)
}

func waitRunning(ctx context.Context, q *QMP) error {
	for {
		var st struct {
			Status string `json:"status"`
		}
		if err := q.Execute(ctx, "query-status", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "running":
			return nil
		case "paused":
			// The saved VM was stopped (a paused sandbox is stopped
			// before it is saved): QEMU keeps the source's run
			// state instead of starting it.
			if err := q.Execute(ctx, "cont", nil, nil); err != nil {
				return err
			}
			continue
		}
		t := time.NewTimer(time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the VM is %q, not running: %w", st.Status, ctx.Err())
		case <-t.C:
		}
	}
}

// dialQMPWhenReady dials the control socket, which QEMU creates while it
// parses its options, retrying until it exists.
func dialQMPWhenReady(ctx context.Context, vm *VM, path string) (*QMP, error) {
	for {
		q, err := DialQMP(ctx, path)
		if err == nil {
			return q, nil
		}
		select {
		case <-vm.done:
			return nil, fmt.Errorf("qemu exited: %v", vm.waitErr)
		case <-ctx.Done():
			return nil, err
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Stop freezes a VM's vCPUs through its control socket, so that a save
// that follows is of a still VM (no page is dirtied while it is copied).
func Stop(ctx context.Context, stateDir string) error {
	q, err := DialQMP(ctx, filepath.Join(stateDir, QMPName))
	if err != nil {
		return err
	}
	defer q.Close()
	return q.Execute(ctx, "stop", nil, nil)
}

// SaveTemplate saves a VM launched with MemoryShared and Control as a
// template: its device state goes to stateFile (created, 0600) and its RAM
// is already in the memory file. The VM is left paused; the caller quits
// it (Quit) and only then uses the memory file, which the guest can no
// longer write. Close the host's agent connection first, so that a clone's
// agent is waiting for a new host, as at boot.
func SaveTemplate(ctx context.Context, stateDir, stateFile string) error {
	q, err := DialQMP(ctx, filepath.Join(stateDir, QMPName))
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.setIgnoreShared(ctx); err != nil {
		return err
	}
	// QEMU writes the stream to a socket of ours: its seccomp sandbox
	// forbids the exec: transport, and fd passing needs SCM_RIGHTS.
	sock := filepath.Join(stateDir, "save.sock")
	_ = os.Remove(sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return fmt.Errorf("save template: %w", err)
	}
	defer func() { _ = ln.Close(); _ = os.Remove(sock) }()
	out, err := os.OpenFile(stateFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("save template: %w", err)
	}
	defer out.Close()

	copied := make(chan error, 1)
	go func() {
		stop := context.AfterFunc(ctx, func() { _ = ln.SetDeadline(time.Now()) })
		defer stop()
		c, err := ln.AcceptUnix()
		if err != nil {
			copied <- err
			return
		}
		defer c.Close()
		stopc := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
		defer stopc()
		_, err = io.Copy(out, c)
		copied <- err
	}()
	if err := q.Execute(ctx, "migrate", map[string]any{"uri": "unix:" + sock}, nil); err != nil {
		_ = ln.Close()
		<-copied
		return fmt.Errorf("save template: %w", err)
	}
	werr := q.WaitMigration(ctx)
	if werr != nil {
		_ = ln.SetDeadline(time.Now())
	}
	cerr := <-copied
	if err := errors.Join(werr, cerr); err != nil {
		return fmt.Errorf("save template: %w", err)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("save template: %w", err)
	}
	return out.Close()
}

// Quit asks QEMU to exit through its control socket.
func Quit(ctx context.Context, stateDir string) error {
	q, err := DialQMP(ctx, filepath.Join(stateDir, QMPName))
	if err != nil {
		return err
	}
	defer q.Close()
	err = q.Execute(ctx, "quit", nil, nil)
	// QEMU may close the socket before its reply arrives.
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		var qe *QMPError
		if errors.As(err, &qe) {
			return err
		}
		return nil
	}
	return err
}
