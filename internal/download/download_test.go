package download

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.tar.gz")
	assert.NilError(t, os.WriteFile(file, []byte("hello"), 0o644))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/a" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "hello")
	}))
	defer srv.Close()

	for _, tc := range []struct {
		name, url, reason string
	}{
		{"file", "file://" + filepath.ToSlash(file), ""},
		{"http", srv.URL + "/a", ""},
		{"http status", srv.URL + "/b", "the server answered 404 Not Found"},
		{"missing file", "file://" + filepath.ToSlash(filepath.Join(dir, "none")), "no such file or directory"},
		{"directory", "file://" + filepath.ToSlash(dir), "not a regular file"},
		{"scheme", "ftp://example.invalid/a", "only http, https and file URLs are downloaded"},
		{"not a URL", "http://[::1", "not a URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, total, err := Open(context.Background(), srv.Client(), tc.url, 10*time.Second)
			if tc.reason != "" {
				var oe *OpenError
				assert.Assert(t, errors.As(err, &oe), "%v", err)
				assert.Equal(t, oe.Reason, tc.reason)
				assert.Check(t, !strings.Contains(err.Error(), dir), "the reason names no path")
				return
			}
			assert.NilError(t, err)
			data, err := io.ReadAll(body)
			assert.NilError(t, err)
			assert.NilError(t, body.Close())
			assert.Equal(t, string(data), "hello")
			assert.Equal(t, total, int64(5))
		})
	}
}

func TestOpenCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := Open(ctx, nil, "http://127.0.0.1:1/a", time.Second)
	var oe *OpenError
	assert.Assert(t, errors.As(err, &oe))
	assert.Check(t, is.Contains(oe.Reason, "context canceled"))
}

func TestCopy(t *testing.T) {
	data := []byte(strings.Repeat("x", 1000))
	want := sha256.Sum256(data)
	for _, tc := range []struct {
		name  string
		limit int64
		n     int64
	}{
		{"under the limit", 2000, 1000},
		{"at the limit", 1000, 1000},
		{"over the limit reads one more byte", 999, 1000},
		{"far over the limit", 10, 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dst bytes.Buffer
			var reports []int64
			m := &Meter{Total: 1000, Steps: 4, Report: func(n int64) { reports = append(reports, n) }}
			n, sum, err := Copy(&dst, bytes.NewReader(data), tc.limit, m)
			assert.NilError(t, err)
			assert.Equal(t, n, tc.n)
			assert.Equal(t, int64(dst.Len()), tc.n)
			if n == 1000 {
				assert.Equal(t, sum, hex.EncodeToString(want[:]))
			}
			assert.Assert(t, len(reports) > 0)
			assert.Equal(t, reports[len(reports)-1] <= n, true)
		})
	}
	n, sum, err := Copy(io.Discard, bytes.NewReader(data), 5000, nil)
	assert.NilError(t, err)
	assert.Equal(t, n, int64(1000))
	assert.Equal(t, sum, hex.EncodeToString(want[:]))
}

// The meter reports in byte steps, never in time: at most Steps+1 events
// for a known size, one per MiB for an unknown one.
func TestMeter(t *testing.T) {
	for _, tc := range []struct {
		name        string
		total       int64
		steps       int64
		writes      int
		size        int
		minN, maxN  int
		lastAtLeast int64
	}{
		{"known size", 1000, 50, 1000, 1, 50, 51, 980},
		{"known size, one write", 1000, 50, 1, 1000, 1, 1, 1000},
		{"unknown size", 0, 50, 5, 1 << 20, 5, 5, 5 << 20},
		{"zero steps", 100, 0, 100, 1, 1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int64
			m := &Meter{Total: tc.total, Steps: tc.steps, Report: func(n int64) { got = append(got, n) }}
			buf := make([]byte, tc.size)
			for range tc.writes {
				k, err := m.Write(buf)
				assert.NilError(t, err)
				assert.Equal(t, k, tc.size)
			}
			assert.Check(t, len(got) >= tc.minN && len(got) <= tc.maxN, "%d events: %v", len(got), got)
			assert.Check(t, got[len(got)-1] >= tc.lastAtLeast, "%v", got)
			assert.Equal(t, got[0], int64(tc.size), "the first write reports")
		})
	}
}
