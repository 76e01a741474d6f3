// Package syncbuf is a byte buffer that several goroutines may write while
// another reads it: the log of a subprocess (go-plugin copies its stderr
// from its own goroutines) or of an hclog logger that a test prints when it
// fails.
package syncbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer guarded by a mutex. The zero value is empty and
// ready to use; it must not be copied after first use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail is the last n lines written (a final partial line counts as one),
// for failure reports of long logs.
func (b *Buffer) Tail(n int) string {
	lines := strings.Split(b.String(), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
