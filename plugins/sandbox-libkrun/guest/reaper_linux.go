package guest

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Waiter starts child processes and delivers their exit status.
//
// Start runs fork (which starts one child and returns its pid) so that the
// child's exit cannot be collected before the returned channel is set up to
// receive it.
type Waiter interface {
	Start(fork func() (int, error)) (pid int, exited <-chan syscall.WaitStatus, err error)
}

// Reaper is the Waiter for PID 1. Orphans are re-parented to init, so PID 1
// must collect every child that exits, not only its own; it calls
// wait4(-1) on each SIGCHLD and routes the status of a process started
// through Start to its channel. Everything else is simply reaped, so no
// zombie stays behind.
//
// Nothing else in the process may wait for children (os/exec's Wait would
// race with the reaper), which is why the agent forks with
// syscall.ForkExec only.
type Reaper struct {
	mu      sync.Mutex
	waiting map[int]chan syscall.WaitStatus
	reaped  int // orphans collected; for logs and tests
}

var _ Waiter = (*Reaper)(nil)

// NewReaper returns a Reaper; Run must be running for statuses to arrive.
func NewReaper() *Reaper {
	return &Reaper{waiting: make(map[int]chan syscall.WaitStatus)}
}

// Start implements Waiter. The lock held across fork is what makes the
// routing safe: wait4 may return the new pid before fork returns, but the
// reaper then blocks on the lock until the pid is registered.
func (r *Reaper) Start(fork func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[pid] = ch
	return pid, ch, nil
}

// Run reaps children until ctx ends.
func (r *Reaper) Run(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	for {
		r.reapAll()
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		}
	}
}

// Reaped returns how many processes nobody was waiting for were collected.
func (r *Reaper) Reaped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reaped
}

func (r *Reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		if ch, ok := r.waiting[pid]; ok {
			delete(r.waiting, pid)
			ch <- ws
		} else {
			r.reaped++
		}
		r.mu.Unlock()
	}
}

// PIDWaiter is the Waiter for an agent that is not PID 1 (tests, a
// development run on a host): it waits for each child by pid and leaves
// other processes alone.
type PIDWaiter struct{}

var _ Waiter = PIDWaiter{}

// Start implements Waiter.
func (PIDWaiter) Start(fork func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	go func() {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		ch <- ws
	}()
	return pid, ch, nil
}
