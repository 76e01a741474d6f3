package procstats

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestReadCountsThisProcess(t *testing.T) {
	before := Read()
	assert.Assert(t, before.Goroutines >= 1)
	assert.Assert(t, before.RSSBytes > 0, "rss %d", before.RSSBytes)

	release := make(chan struct{})
	const extra = 5
	started := make(chan struct{}, extra)
	for range extra {
		go func() {
			started <- struct{}{}
			<-release
		}()
	}
	for i := range extra {
		waitfor.Recv(t, started, waitfor.Default, fmt.Sprintf("goroutine %d of %d to start", i+1, extra))
	}
	defer close(release)
	if before.OpenFDs < 0 {
		t.Skip("this system does not show open descriptors")
	}
	var files []*os.File
	for i := range 3 {
		f, err := os.Create(filepath.Join(t.TempDir(), "f"+string(rune('a'+i))))
		assert.NilError(t, err)
		files = append(files, f)
	}
	after := Read()
	for _, f := range files {
		f.Close()
	}
	assert.Assert(t, after.Goroutines >= before.Goroutines+extra, "goroutines %d then %d", before.Goroutines, after.Goroutines)
	assert.Equal(t, after.OpenFDs, before.OpenFDs+len(files))
	assert.Equal(t, Read().OpenFDs, before.OpenFDs, "the files closed")
}

func TestShape(t *testing.T) {
	s := Stats{Goroutines: 7, OpenFDs: 12, RSSBytes: 3 << 20}
	want := `{"goroutines":7,"open_fds":12,"rss_bytes":3145728}`
	b, err := json.Marshal(s)
	assert.NilError(t, err)
	assert.Equal(t, string(b), want)
	b, err = json.Marshal(s.Map())
	assert.NilError(t, err)
	assert.Equal(t, string(b), want, "the map form has the same keys and values")
}
