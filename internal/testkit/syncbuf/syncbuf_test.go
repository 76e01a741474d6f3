package syncbuf

import (
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// Concurrent writers all land, whole, while a reader reads; the race
// detector checks the locking.
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	const writers, lines = 8, 100
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range lines {
				_, _ = b.Write([]byte("line\n"))
				_ = b.String()
			}
		}()
	}
	waitfor.Group(t, &wg, waitfor.Default, "the writers")
	assert.Equal(t, b.String(), strings.Repeat("line\n", writers*lines))
}

func TestTail(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		n        int
		want     string
	}{
		{name: "empty", in: "", n: 3, want: ""},
		{name: "fewer lines than n", in: "a\nb", n: 3, want: "a\nb"},
		{name: "last lines", in: "a\nb\nc\nd", n: 2, want: "c\nd"},
		{name: "a final newline counts as an empty last line", in: "a\nb\nc\n", n: 2, want: "c\n"},
		{name: "zero", in: "a\nb", n: 0, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b Buffer
			_, _ = b.Write([]byte(tc.in))
			assert.Equal(t, b.Tail(tc.n), tc.want)
		})
	}
}
