// Package consolelog keeps a VM's serial console on the host within a
// fixed size. The guest writes its console as fast as it likes (code in a
// sandbox runs as root and can write /dev/console in a loop), so the file
// is never the VMM's: the VMM writes into a pipe, and the host side reads it
// into a Log, which rotates: the newest output is in console.log, the output
// before it in console.log.1, each at most half the cap, the oldest dropped.
package consolelog

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
)

// Bounds of the cap.
const (
	// DefaultMaxBytes is the cap when none is configured: 2 MiB, about
	// ten seconds of a guest writing its console flat out under TCG, and
	// thousands of boots' worth of kernel and agent messages.
	DefaultMaxBytes = 2 << 20
	// MinMaxBytes and MaxMaxBytes bound a configured cap.
	MinMaxBytes = 16 << 10
	MaxMaxBytes = 1 << 30
)

// RotatedSuffix names the file that holds the output before the newest.
const RotatedSuffix = ".1"

// Log is a console log of at most its cap on disk: path holds the newest
// output, path+RotatedSuffix the output before it; each holds at most half
// the cap. Writes never fail for want of room: what does not fit rotates.
type Log struct {
	path string
	half int64
	mu   sync.Mutex
	f    *os.File
	size int64
}

// Create starts the log at path with a cap of maxBytes (0 means
// DefaultMaxBytes), empty: a console log left by an earlier VM in the same
// directory, and its rotated file, are replaced.
func Create(path string, maxBytes int64) (*Log, error) {
	if maxBytes == 0 {
		maxBytes = DefaultMaxBytes
	}
	if maxBytes < MinMaxBytes || maxBytes > MaxMaxBytes {
		return nil, fmt.Errorf("console log cap %d bytes is outside %d..%d", maxBytes, MinMaxBytes, MaxMaxBytes)
	}
	if err := os.Remove(path + RotatedSuffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("console log: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("console log: %w", err)
	}
	return &Log{path: path, half: maxBytes / 2, f: f}, nil
}

// Write appends p, rotating as often as it takes.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, os.ErrClosed
	}
	written := 0
	for len(p) > 0 {
		if l.size >= l.half {
			if err := l.rotateLocked(); err != nil {
				return written, err
			}
		}
		chunk := p[:min(int64(len(p)), l.half-l.size)]
		n, err := l.f.Write(chunk)
		l.size += int64(n)
		written += n
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

func (l *Log) rotateLocked() error {
	if err := l.f.Close(); err != nil {
		l.f = nil
		return err
	}
	l.f = nil
	if err := os.Rename(l.path, l.path+RotatedSuffix); err != nil {
		return fmt.Errorf("rotate the console log: %w", err)
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("rotate the console log: %w", err)
	}
	l.f, l.size = f, 0
	return nil
}

// Close closes the log's file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Pump copies r, the host's end of the VM's console, into l until r ends
// (the VMM exited), then closes l and r. A write that fails (a full disk)
// does not stop it: the console is still read, so the guest never blocks on
// it, and what it wrote is dropped. It returns the first write error.
func Pump(r io.ReadCloser, l *Log) error {
	defer r.Close()
	defer l.Close()
	var werr error
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, e := l.Write(buf[:n]); e != nil && werr == nil {
				werr = e
			}
		}
		if err != nil {
			return werr
		}
	}
}

// Tail returns the last n lines of the console log at path: of the last
// window bytes of path+RotatedSuffix and path together.
func Tail(path string, n, window int) string {
	cur := readEnd(path, window)
	// The newest file may start mid-line (a rotation splits writes, not
	// lines), so what fits of the window comes from the rotated one.
	if prev := readEnd(path+RotatedSuffix, window-len(cur)); len(prev) > 0 {
		cur = append(prev, cur...)
	}
	s := strings.TrimRight(strings.ToValidUTF8(string(cur), "?"), "\n")
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// readEnd returns the last window bytes of the file at p; nothing if it
// cannot be read.
func readEnd(p string, window int) []byte {
	if window <= 0 {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(fi.Size()-int64(window), 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, int64(window)))
	if err != nil {
		return nil
	}
	return b
}
