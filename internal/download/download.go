// Package download reads an artefact from an http, https or file URL,
// hashes it with SHA-256 as it is copied and meters its progress: the part
// that `iii compose` package installs and `iii update` share. Each caller
// keeps its own error codes and messages and decides what a size or digest
// mismatch means.
package download

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// OpenError says why a URL could not be opened, in words fit for the end
// of a caller's message ("the server answered 404 Not Found"); it carries
// neither the URL nor what was being downloaded.
type OpenError struct{ Reason string }

func (e *OpenError) Error() string { return e.Reason }

func openError(format string, args ...any) error {
	return &OpenError{Reason: fmt.Sprintf(format, args...)}
}

// Open starts reading raw: a local file for file URLs, a GET bounded by
// timeout for http and https. total is the length when it is known, else
// 0. Every failure is an *OpenError. A nil client is a default one.
func Open(ctx context.Context, client *http.Client, raw string, timeout time.Duration) (body io.ReadCloser, total int64, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, 0, openError("not a URL")
	}
	switch u.Scheme {
	case "file":
		f, err := os.Open(filepath.FromSlash(u.Path))
		if err != nil {
			return nil, 0, openError("%v", unwrapPath(err))
		}
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			f.Close()
			return nil, 0, openError("not a regular file")
		}
		return f, st.Size(), nil
	case "http", "https":
		dctx, cancel := context.WithTimeout(ctx, timeout)
		req, err := http.NewRequestWithContext(dctx, http.MethodGet, u.String(), nil)
		if err != nil {
			cancel()
			return nil, 0, openError("%v", err)
		}
		if client == nil {
			client = &http.Client{}
		}
		resp, err := client.Do(req)
		if err != nil {
			cancel()
			return nil, 0, openError("%v", UnwrapURL(err))
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			cancel()
			return nil, 0, openError("the server answered %s", resp.Status)
		}
		return &cancelBody{ReadCloser: resp.Body, cancel: cancel}, max(resp.ContentLength, 0), nil
	}
	return nil, 0, openError("only http, https and file URLs are downloaded")
}

// cancelBody ends the download's context when the body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelBody) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// Copy copies src into dst, reading at most limit+1 bytes so that n >
// limit tells the caller the artefact is larger than it accepts, and
// returns the hex SHA-256 of what it copied. meter, when not nil, sees
// every byte after dst and the hash did.
func Copy(dst io.Writer, src io.Reader, limit int64, meter io.Writer) (n int64, sha256Hex string, err error) {
	h := sha256.New()
	ws := []io.Writer{dst, h}
	if meter != nil {
		ws = append(ws, meter)
	}
	n, err = io.Copy(io.MultiWriter(ws...), io.LimitReader(src, limit+1))
	return n, hex.EncodeToString(h.Sum(nil)), err
}

// meterChunk is how often a download of unknown size reports.
const meterChunk = 1 << 20

// Meter counts the bytes written to it and calls Report with the running
// count on the first write and then about Steps times over Total bytes
// (every MiB when Total is unknown). Steps are in bytes, not time, so the
// same download always reports the same way.
type Meter struct {
	Total  int64
	Steps  int64
	Report func(bytes int64)

	n, next int64
}

func (m *Meter) Write(b []byte) (int, error) {
	m.n += int64(len(b))
	if m.n >= m.next {
		m.Report(m.n)
		step := int64(meterChunk)
		if m.Total > 0 {
			step = max(m.Total/max(m.Steps, 1), 1)
		}
		m.next = m.n + step
	}
	return len(b), nil
}

// UnwrapURL is the cause of a *url.Error, whose own text repeats the
// method and URL that callers' messages already name.
func UnwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
