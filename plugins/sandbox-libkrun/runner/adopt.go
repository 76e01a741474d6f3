package runner

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Re-adoption: the handshake both sides speak on runner.sock (doc.go
// describes it), the key file, and Adopt, the adapter's side. The runner's
// side is keeper.go.

const (
	// adoptVersion is the handshake's version; a runner and an adapter
	// of different versions refuse each other rather than guess.
	adoptVersion = "1"
	helloWord    = "III-RUNNER"
	adoptWord    = "ADOPT"
	okWord       = "OK"
	noWord       = "NO"
	// keyLen is the size of adopt.key; nonceLen that of the runner's
	// challenge.
	keyLen   = 32
	nonceLen = 32
	// maxLine bounds every handshake line, its newline included: the
	// socket is reachable by any process of the user.
	maxLine = 256
	// handshakeTimeout bounds a whole handshake, on either side.
	handshakeTimeout = 5 * time.Second
	// stopByte on a lifeline (the pipe, or an adopted connection) means
	// Release: kill the VM now. The lifeline's end without it means
	// Detach.
	stopByte = 's'
	// macLabel separates this MAC from any other use of the key.
	macLabel = "iii-runner-adopt\x00"
)

// Errors of Adopt.
var (
	// ErrNoRunner: nothing to adopt: no socket, nobody listening on it,
	// no key, or the runner went away during the handshake. The caller
	// cleans the directory.
	ErrNoRunner = errors.New("no runner to adopt")
	// ErrRefused: a runner answered but did not let this process take it
	// over: the proof was wrong, another adapter holds it, it is
	// stopping, it speaks another protocol version, or it is not the
	// process runner.pid names.
	ErrRefused = errors.New("the runner refused the adoption")
)

// adoptMAC is the proof that the holder of key may adopt the runner of
// the state directory dir: HMAC-SHA256(key, macLabel+dir+"\x00"+nonce),
// nonce being the challenge's raw bytes.
func adoptMAC(key []byte, dir string, nonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(macLabel))
	m.Write([]byte(dir))
	m.Write([]byte{0})
	m.Write(nonce)
	return m.Sum(nil)
}

// readLine reads one handshake line, a byte at a time so that nothing past
// its newline is consumed (after the handshake the connection is a
// lifeline), and returns it without the newline. A line longer than max
// bytes, newline included, is an error; so is an end before the newline
// (io.EOF when nothing came at all).
func readLine(r io.Reader, max int) (string, error) {
	buf := make([]byte, 0, 80)
	var b [1]byte
	for len(buf) < max {
		n, err := r.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				return string(buf), nil
			}
			buf = append(buf, b[0])
			continue
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) && len(buf) > 0 {
			return "", io.ErrUnexpectedEOF
		}
		return "", err
	}
	return "", fmt.Errorf("handshake line longer than %d bytes", max-1)
}

// decodeHex decodes s, which must be exactly n bytes in hex.
func decodeHex(s string, n int) ([]byte, error) {
	if len(s) != 2*n {
		return nil, fmt.Errorf("%d hex digits, want %d", len(s), 2*n)
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, errors.New("not hex")
	}
	return b, nil
}

// formatHello is the runner's greeting: its protocol and a challenge.
func formatHello(nonce []byte) string {
	return helloWord + " " + adoptVersion + " " + hex.EncodeToString(nonce) + "\n"
}

// parseHello parses a greeting (without its newline) into the challenge.
func parseHello(line string) ([]byte, error) {
	f := strings.Split(line, " ")
	if f[0] != helloWord || len(f) < 2 {
		return nil, fmt.Errorf("not a runner's greeting: %q", truncate(line, 40))
	}
	if f[1] != adoptVersion {
		return nil, fmt.Errorf("the runner speaks adoption protocol %q, this binary %s", truncate(f[1], 20), adoptVersion)
	}
	if len(f) != 3 {
		return nil, fmt.Errorf("malformed greeting %q", truncate(line, 40))
	}
	nonce, err := decodeHex(f[2], nonceLen)
	if err != nil {
		return nil, fmt.Errorf("greeting's challenge: %w", err)
	}
	return nonce, nil
}

// formatAdopt is the adapter's proof.
func formatAdopt(mac []byte) string { return adoptWord + " " + hex.EncodeToString(mac) + "\n" }

// parseAdopt parses a proof line into its MAC.
func parseAdopt(line string) ([]byte, error) {
	f := strings.Split(line, " ")
	if len(f) != 2 || f[0] != adoptWord {
		return nil, fmt.Errorf("not an adoption request: %q", truncate(line, 40))
	}
	mac, err := decodeHex(f[1], sha256.Size)
	if err != nil {
		return nil, fmt.Errorf("adoption request's proof: %w", err)
	}
	return mac, nil
}

// formatOK is the runner's consent: its pid and its VM's (0 while the VM
// has not started yet).
func formatOK(runnerPID, vmPID int) string {
	return okWord + " " + strconv.Itoa(runnerPID) + " " + strconv.Itoa(vmPID) + "\n"
}

// formatNo is the runner's refusal; reason is one of its own words.
func formatNo(reason string) string { return noWord + " " + reason + "\n" }

// parseReply parses the runner's answer. A refusal is an error wrapping
// ErrRefused, with the runner's reason.
func parseReply(line string) (runnerPID, vmPID int, err error) {
	word, rest, _ := strings.Cut(line, " ")
	switch word {
	case noWord:
		return 0, 0, fmt.Errorf("%w: %q", ErrRefused, truncate(rest, 60))
	case okWord:
	default:
		return 0, 0, fmt.Errorf("not a runner's answer: %q", truncate(line, 40))
	}
	f := strings.Split(rest, " ")
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("malformed answer %q", truncate(line, 40))
	}
	runnerPID, err = ParsePID([]byte(f[0]))
	if err != nil {
		return 0, 0, fmt.Errorf("answer's runner pid: %w", err)
	}
	if f[1] != "0" {
		if vmPID, err = ParsePID([]byte(f[1])); err != nil {
			return 0, 0, fmt.Errorf("answer's VM pid: %w", err)
		}
	}
	return runnerPID, vmPID, nil
}

// proveAdopt is the adapter's side of the handshake on c, up to the
// runner's consent: read the challenge, answer it, read the answer.
func proveAdopt(c io.ReadWriter, key []byte, dir string) (runnerPID, vmPID int, err error) {
	line, err := readLine(c, maxLine)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return 0, 0, fmt.Errorf("%w: the runner closed the connection before its greeting", ErrNoRunner)
		}
		return 0, 0, fmt.Errorf("read the runner's greeting: %w", err)
	}
	nonce, err := parseHello(line)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	if _, err := io.WriteString(c, formatAdopt(adoptMAC(key, dir, nonce))); err != nil {
		return 0, 0, fmt.Errorf("send the adoption proof: %w", err)
	}
	line, err = readLine(c, maxLine)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return 0, 0, fmt.Errorf("%w: the runner closed the connection without an answer", ErrRefused)
		}
		return 0, 0, fmt.Errorf("read the runner's answer: %w", err)
	}
	runnerPID, vmPID, err = parseReply(line)
	if err != nil && !errors.Is(err, ErrRefused) {
		err = fmt.Errorf("%w: %v", ErrRefused, err)
	}
	return runnerPID, vmPID, err
}

// errBadProof: the peer does not hold the key (or named another
// directory).
var errBadProof = errors.New("wrong adoption proof")

// checkAdopt is the runner's side of the handshake on c up to its
// decision: send the challenge nonce, read the proof and check it in
// constant time. It returns the reason to refuse with (a NO line's word)
// along with any error.
func checkAdopt(c io.ReadWriter, key []byte, dir string, nonce []byte) (reason string, err error) {
	if _, err := io.WriteString(c, formatHello(nonce)); err != nil {
		return "", fmt.Errorf("send the greeting: %w", err)
	}
	line, err := readLine(c, maxLine)
	if err != nil {
		return "protocol", fmt.Errorf("read the adoption request: %w", err)
	}
	mac, err := parseAdopt(line)
	if err != nil {
		return "protocol", err
	}
	if !hmac.Equal(mac, adoptMAC(key, dir, nonce)) {
		return "refused", errBadProof
	}
	return "", nil
}

// writeAdoptKey makes a new adoption key at path (0600). Any key there is
// an earlier runner's of the same directory (a resumed sandbox's), whose
// runner has ended: each runner gets its own.
func writeAdoptKey(path string) error {
	key := make([]byte, keyLen)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("adoption key: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the old adoption key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write the adoption key: %w", err)
	}
	_, err = f.Write(key)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write the adoption key: %w", err)
	}
	return nil
}

// readAdoptKey reads an adoption key: a regular file (never a link, a FIFO
// or a device), readable by its owner alone, of exactly keyLen bytes.
func readAdoptKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("adoption key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("adoption key: %w", err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("adoption key %s is not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("adoption key %s has mode %v; it must be readable by its owner alone", path, fi.Mode().Perm())
	case fi.Size() != keyLen:
		return nil, fmt.Errorf("adoption key %s holds %d bytes, not %d", path, fi.Size(), keyLen)
	}
	key := make([]byte, keyLen)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("adoption key: %w", err)
	}
	return key, nil
}

// Adopt takes over the runner of dir, which the caller holds (OpenDir):
// it dials dir's runner.sock, proves it holds dir's adopt.key (the key
// never crosses the socket) and returns a Process whose lifeline is that
// connection. Release, Detach, Stop, Kill, Wait and Done mean what they
// mean for a spawned runner; Done closes when the runner exits (the
// connection reads EOF) and ExitErr is always nil (the runner is not this
// process's child). PID is the runner's, checked against the peer of the
// connection, runner.pid and the process's command line.
//
// Errors: ErrNoRunner (no socket, nobody listening, no key, the runner
// went away), ErrRefused (wrong key, the runner has a live adapter or is
// stopping, another protocol version, a runner that is not runner.pid's),
// ctx's error, or another error (an unreadable key, a failed dial).
func Adopt(ctx context.Context, dir *Dir) (*Process, error) {
	if dir == nil || dir.lock == nil {
		return nil, errors.New("runner: Adopt needs a state directory this process holds (OpenDir)")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path := filepath.Clean(dir.Path)
	key, err := readAdoptKey(dir.File(AdoptKeyName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s: it has no adoption key", ErrNoRunner, path)
	}
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", dir.File(AdoptSocketName))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("adopt the runner of %s: %w", path, ctx.Err())
		}
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w in %s: %v", ErrNoRunner, path, err)
		}
		return nil, fmt.Errorf("dial the runner of %s: %w", path, err)
	}
	c, ok := nc.(*net.UnixConn)
	if !ok {
		_ = nc.Close()
		return nil, fmt.Errorf("dial the runner of %s: not a unix connection", path)
	}
	deadline := time.Now().Add(handshakeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(deadline) {
		deadline = cd
	}
	_ = c.SetDeadline(deadline)
	// A cancelled ctx ends the handshake at once.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	runnerPID, _, err := proveAdopt(c, key, path)
	if !stop() {
		// ctx ended: whatever the runner said, let go of it (without
		// the stop byte, so an adopted runner is kept for its grace).
		_ = c.Close()
		return nil, fmt.Errorf("adopt the runner of %s: %w", path, ctx.Err())
	}
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("adopt the runner of %s: %w", path, err)
	}
	if err := checkRunner(c, runnerPID, path); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("adopt the runner of %s: %w: %v", path, ErrRefused, err)
	}
	_ = c.SetDeadline(time.Time{})
	p := &Process{PID: runnerPID, dir: dir.Path, lifeline: c, adopted: true, done: make(chan struct{})}
	go p.watchConn(c)
	return p, nil
}

// checkRunner checks that the runner that consented on c is the process
// pid it named: the connection's peer, runner.pid's, and the runner of dir
// by its command line. Kill signals that pid.
func checkRunner(c *net.UnixConn, pid int, dir string) error {
	peer, err := peerPID(c)
	if err != nil {
		return fmt.Errorf("the runner's credentials: %w", err)
	}
	if peer != pid {
		return fmt.Errorf("the runner says it is pid %d, its socket is pid %d's", pid, peer)
	}
	recorded, err := ReadPID(filepath.Join(dir, RunnerPIDName))
	if err != nil {
		return fmt.Errorf("runner.pid: %w", err)
	}
	if recorded != pid {
		return fmt.Errorf("the runner is pid %d, runner.pid says %d", pid, recorded)
	}
	if !BelongsTo(procArgs(pid), dir) {
		return fmt.Errorf("process %d is not the runner of %s", pid, dir)
	}
	return nil
}

// watchConn reads an adopted lifeline until the runner closes it (it has
// exited) and then marks the Process done. Nothing the runner sends
// matters.
func (p *Process) watchConn(c *net.UnixConn) {
	buf := make([]byte, 64)
	for {
		if _, err := c.Read(buf); err != nil {
			break
		}
	}
	_ = c.Close()
	close(p.done)
}
