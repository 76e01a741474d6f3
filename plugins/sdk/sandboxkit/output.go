package sandboxkit

import (
	"math"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// OutputBuffer collects one output stream of an exec, keeping the first
// contract.ExecOutputCap bytes. It accepts (and drops) everything past the
// cap, so a chatty process is never blocked on a full pipe, and it records
// that it dropped something. Safe for concurrent writers.
type OutputBuffer struct {
	mu        sync.Mutex
	buf       []byte
	truncated bool
}

// Write keeps what fits under the cap and always reports len(p) written.
func (b *OutputBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := contract.ExecOutputCap - len(b.buf)
	if len(p) > room {
		b.truncated = true
		b.buf = append(b.buf, p[:max(room, 0)]...)
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Bytes returns what was kept.
func (b *OutputBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}

// Truncated reports whether anything was dropped.
func (b *OutputBuffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.truncated
}

// capOutput enforces the cap on a provider's result, in case a provider
// returned more than it should have.
func capOutput(b []byte, truncated bool) ([]byte, bool) {
	if len(b) > contract.ExecOutputCap {
		return b[:contract.ExecOutputCap], true
	}
	return b, truncated
}

// durationOf multiplies n units into a Duration, saturating instead of
// overflowing: configuration allows numbers no clock needs.
func durationOf(n uint64, unit time.Duration) time.Duration {
	if n > uint64(math.MaxInt64/int64(unit)) {
		return math.MaxInt64
	}
	return time.Duration(n) * unit
}

// addSat adds durations, saturating.
func addSat(a, b time.Duration) time.Duration {
	if a > 0 && b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}
