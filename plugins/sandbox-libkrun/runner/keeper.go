package runner

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// maxHandshakes bounds the handshakes a runner serves at once; a client
// past it is hung up on. Any process of the user can connect, and each
// handshake holds a descriptor for up to handshakeTimeout.
const maxHandshakes = 4

// busyWait is how long an adoption request that proved the key waits for
// a live lifeline to end before it is refused as busy: a new adapter can
// ask before the runner has read the end of the old one's lifeline.
const busyWait = 500 * time.Millisecond

// keeper is the runner's side of its lifelines: the pipe from the adapter
// that spawned it, then the connections of adapters that adopt it. It
// decides when the VM must go: at a stop byte, at a lifeline's end when
// the runner may not be adopted, and when its adoption grace runs out.
type keeper struct {
	log hclog.Logger
	// dir is the state directory, as the MAC names it.
	dir string
	// key is adopt.key; nil when the runner may not be adopted
	// (AdoptGraceMS 0): a lifeline's end then kills the VM.
	key   []byte
	grace time.Duration
	// cancel ends the VM, with the reason.
	cancel context.CancelCauseFunc
	vmPID  atomic.Int64

	mu sync.Mutex
	// live: an adapter holds a lifeline; a new one is refused ("busy").
	live bool
	// freed is closed when the live lifeline ends (a new one is made
	// for each).
	freed chan struct{}
	// stopping: the VM is being killed; no one may adopt it any more.
	stopping bool
	// gen counts changes of hands, so that a grace timer that fires as
	// an adapter adopts the runner does nothing.
	gen   uint64
	timer *time.Timer
	// kept holds every adopted connection, live or let go of: each stays
	// open until the runner exits, so that its EOF (Process.Done) means
	// "the runner has exited" (and no finalizer closes it earlier).
	kept []net.Conn
}

// newKeeper returns the keeper of a runner whose spawning adapter holds
// its lifeline; key nil means it may not be adopted.
func newKeeper(log hclog.Logger, dir string, key []byte, grace time.Duration, cancel context.CancelCauseFunc) *keeper {
	return &keeper{log: log, dir: dir, key: key, grace: grace, cancel: cancel, live: true, freed: make(chan struct{})}
}

// end kills the VM: nobody may adopt the runner any more.
func (k *keeper) end(cause error) {
	k.mu.Lock()
	k.stopping = true
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
	k.mu.Unlock()
	k.cancel(cause)
}

// watch reads the lifeline r (what names it in logs) until the stop byte,
// which ends the VM, or its end, which detaches the adapter. Other bytes
// mean nothing.
func (k *keeper) watch(r io.Reader, what string) {
	buf := make([]byte, 64)
	for {
		n, err := r.Read(buf)
		for _, b := range buf[:n] {
			if b == stopByte {
				k.end(fmt.Errorf("the adapter released the VM (%s: stop)", what))
				return
			}
		}
		if err != nil {
			why := err.Error()
			if errors.Is(err, io.EOF) {
				why = "EOF"
			}
			k.detached(what, why)
			return
		}
	}
}

// detached: the adapter holding the lifeline let go without stopping the
// VM (Detach, or it died). Without adoption that ends the VM; with it the
// VM is kept for the grace.
func (k *keeper) detached(what, why string) {
	if k.key == nil {
		k.end(fmt.Errorf("the adapter let go of the VM (%s: %s)", what, why))
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopping || !k.live {
		// Only the live lifeline's end starts a grace (there is one
		// live lifeline at a time).
		return
	}
	k.live = false
	close(k.freed)
	k.gen++
	gen := k.gen
	k.log.Info("adapter gone; keeping the VM for "+k.grace.String()+" for a new adapter", "lifeline", what, "cause", why)
	k.timer = time.AfterFunc(k.grace, func() { k.expire(gen) })
}

// expire ends the VM when no adapter has adopted it since generation gen
// began its grace.
func (k *keeper) expire(gen uint64) {
	k.mu.Lock()
	if k.live || k.gen != gen || k.stopping {
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	k.end(fmt.Errorf("no adapter adopted the VM within %s (lifeline: EOF)", k.grace))
}

// listenAdopt serves path (a stale socket there is removed first),
// accessible to this user alone.
func listenAdopt(path string) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove a stale adoption socket: %w", err)
	}
	// The runner is its own process and starts nothing concurrently
	// yet: the umask makes the socket 0600 from its creation, not only
	// after the chmod.
	old := syscall.Umask(0o077)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on the adoption socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("adoption socket: %w", err)
	}
	return ln, nil
}

// serve answers adoption requests on ln until it is closed.
func (k *keeper) serve(ln net.Listener) {
	sem := make(chan struct{}, maxHandshakes)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, most likely: back off rather than
			// spin.
			k.log.Warn("adoption socket accept failed", "error", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		select {
		case sem <- struct{}{}:
			go func() {
				adopted := k.handshake(c)
				<-sem
				if adopted {
					k.watch(c, "adopted lifeline")
				}
			}()
		default:
			k.log.Warn("too many adoption handshakes at once; hung up on one")
			_ = c.Close()
		}
	}
}

// handshake answers one adoption request on c. A wrong proof is logged
// and changes nothing; a right one while another adapter holds the VM is
// refused ("busy"); otherwise c becomes the lifeline, for the caller to
// watch, and adopted is true.
func (k *keeper) handshake(c net.Conn) (adopted bool) {
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	nonce := make([]byte, nonceLen)
	if _, err := rand.Read(nonce); err != nil {
		k.log.Error("adoption challenge", "error", err)
		_ = c.Close()
		return false
	}
	if reason, err := checkAdopt(c, k.key, k.dir, nonce); err != nil {
		k.log.Warn("refused an adoption: the peer did not prove it holds the key", "error", err)
		if reason != "" {
			_, _ = io.WriteString(c, formatNo(reason))
		}
		_ = c.Close()
		return false
	}
	k.mu.Lock()
	if k.live && !k.stopping {
		// An adapter that has just died may not have been noticed
		// yet: its lifeline's end may be a read away.
		freed := k.freed
		k.mu.Unlock()
		t := time.NewTimer(busyWait)
		select {
		case <-freed:
		case <-t.C:
		}
		t.Stop()
		k.mu.Lock()
	}
	reason := ""
	switch {
	case k.stopping:
		reason = "stopping"
	case k.live:
		reason = "busy"
	}
	if reason != "" {
		k.mu.Unlock()
		k.log.Info("refused an adoption", "reason", reason)
		_, _ = io.WriteString(c, formatNo(reason))
		_ = c.Close()
		return false
	}
	k.live = true
	k.freed = make(chan struct{})
	k.gen++
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
	k.kept = append(k.kept, c)
	k.mu.Unlock()
	// A failed write leaves a broken connection, whose first read ends
	// at once: the grace starts again.
	_, err := io.WriteString(c, formatOK(os.Getpid(), int(k.vmPID.Load())))
	_ = c.SetDeadline(time.Time{})
	if err == nil {
		k.log.Info("a new adapter adopted the VM")
	}
	return true
}
