package selfupdate

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

	"github.com/iii-sandbox/iii/compose/packages"
)

// fetcher reads indexes and archives from a source.
type fetcher struct {
	http     *http.Client
	progress packages.Progress
}

func (f *fetcher) report(ev packages.Event) {
	if f.progress != nil {
		f.progress(ev)
	}
}

// index reads and decodes the source's index.json. A source that cannot
// be read is RELEASE_SOURCE_UNREACHABLE.
func (f *fetcher) index(ctx context.Context, src Source) (*Index, error) {
	where := src.IndexLocation()
	unreachable := func(format string, args ...any) error {
		return newError(CodeSourceUnreachable, fmt.Sprintf("%s: %s; check the URL or directory (--source, $%s)", src.Describe(), fmt.Sprintf(format, args...), EnvSource))
	}
	var data []byte
	if src.IsDir() {
		st, err := os.Stat(src.dir)
		if err != nil || !st.IsDir() {
			return nil, unreachable("%s is not a directory (%s)", src.dir, errText(err, "a file"))
		}
		fh, err := os.Open(where)
		if err != nil {
			return nil, unreachable("cannot read %s: %s", where, errText(err, ""))
		}
		defer fh.Close()
		if data, err = io.ReadAll(io.LimitReader(fh, MaxIndexBytes+1)); err != nil {
			return nil, unreachable("cannot read %s: %s", where, errText(err, ""))
		}
	} else {
		ctx, cancel := context.WithTimeout(ctx, IndexTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, where, nil)
		if err != nil {
			return nil, unreachable("%v", err)
		}
		req.Header.Set("Accept", "application/json")
		resp, err := f.http.Do(req)
		if err != nil {
			return nil, unreachable("GET %s failed: %v", where, unwrapURL(err))
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, unreachable("GET %s answered %s", where, resp.Status)
		}
		if data, err = io.ReadAll(io.LimitReader(resp.Body, MaxIndexBytes+1)); err != nil {
			return nil, unreachable("reading %s failed: %v", where, unwrapURL(err))
		}
	}
	return DecodeIndex(data, where)
}

// download copies the asset at u into dst, checking its size and SHA-256
// as the index lists them; label names it in messages and progress
// ("iii 0.26.1"). Nothing downloaded is used unless both match.
func (f *fetcher) download(ctx context.Context, u string, a Asset, label, target string, dst io.Writer) error {
	body, total, err := f.open(ctx, u, label)
	if err != nil {
		return err
	}
	defer body.Close()
	if a.Size > 0 {
		total = a.Size
	}
	f.report(packages.Event{Phase: packages.PhaseDownload, Package: label, Target: target, URL: u, Total: total})
	limit := int64(MaxArchiveBytes)
	if a.Size > 0 {
		limit = a.Size
	}
	h := sha256.New()
	pw := &progressWriter{report: f.report, ev: packages.Event{Phase: packages.PhaseProgress, Package: label, Target: target, Total: total}}
	n, err := io.Copy(io.MultiWriter(dst, h, pw), io.LimitReader(body, limit+1))
	if err != nil {
		if ctx.Err() != nil {
			return newError(CodeDownloadFailed, fmt.Sprintf("the download of %s from %s was interrupted (%v); nothing was changed", label, u, ctx.Err()))
		}
		return newError(CodeDownloadFailed, fmt.Sprintf("the download of %s from %s failed after %d bytes: %v; nothing was changed", label, u, n, unwrapURL(err)))
	}
	mismatch := func(why string) error {
		return newError(CodeDigestMismatch, fmt.Sprintf(
			"the archive of %s (%s) from %s does not match the release index: %s, and sha256 %s is expected; nothing was changed. The archive changed after the index was written, or the download was altered",
			label, target, u, why, a.SHA256))
	}
	switch {
	case n > limit && a.Size > 0:
		return mismatch(fmt.Sprintf("it is larger than the %d bytes the index lists", a.Size))
	case n > limit:
		return newError(CodeDownloadFailed, fmt.Sprintf("the archive of %s at %s is larger than %d MiB; iii update refuses it", label, u, MaxArchiveBytes>>20))
	case a.Size > 0 && n != a.Size:
		return mismatch(fmt.Sprintf("it has %d bytes, not the %d the index lists", n, a.Size))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		return mismatch("its sha256 is " + got)
	}
	f.report(packages.Event{Phase: packages.PhaseVerified, Package: label, Target: target, Bytes: n, Total: n})
	return nil
}

// open starts reading an asset URL (http, https or file); total is its
// length when known.
func (f *fetcher) open(ctx context.Context, raw, label string) (io.ReadCloser, int64, error) {
	fail := func(format string, args ...any) error {
		return newError(CodeDownloadFailed, fmt.Sprintf("the download of %s from %s failed: %s; nothing was changed", label, raw, fmt.Sprintf(format, args...)))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, 0, fail("not a URL")
	}
	switch u.Scheme {
	case "file":
		fh, err := os.Open(filepath.FromSlash(u.Path))
		if err != nil {
			return nil, 0, fail("%s", errText(err, ""))
		}
		st, err := fh.Stat()
		if err != nil || !st.Mode().IsRegular() {
			fh.Close()
			return nil, 0, fail("not a regular file")
		}
		return fh, st.Size(), nil
	case "http", "https":
		dctx, cancel := context.WithTimeout(ctx, DownloadTimeout)
		req, err := http.NewRequestWithContext(dctx, http.MethodGet, u.String(), nil)
		if err != nil {
			cancel()
			return nil, 0, fail("%v", err)
		}
		resp, err := f.http.Do(req)
		if err != nil {
			cancel()
			return nil, 0, fail("%v", unwrapURL(err))
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			cancel()
			return nil, 0, fail("the server answered %s", resp.Status)
		}
		return &cancelBody{ReadCloser: resp.Body, cancel: cancel}, max(resp.ContentLength, 0), nil
	}
	return nil, 0, fail("only http, https and file URLs are downloaded")
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

// progressSteps bounds the progress events of a download of known size;
// unknown sizes report every progressChunk bytes. Steps are in bytes, not
// time, so a download always reports the same way.
const (
	progressSteps = 100
	progressChunk = 1 << 20
)

type progressWriter struct {
	report func(packages.Event)
	ev     packages.Event
	next   int64
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.ev.Bytes += int64(len(b))
	if p.ev.Bytes >= p.next {
		p.report(p.ev)
		step := int64(progressChunk)
		if p.ev.Total > 0 {
			step = max(p.ev.Total/progressSteps, 1)
		}
		p.next = p.ev.Bytes + step
	}
	return len(b), nil
}

func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// errText is an error's text without the path an *fs.PathError repeats.
func errText(err error, otherwise string) string {
	var pe *fs.PathError
	switch {
	case errors.As(err, &pe):
		return pe.Err.Error()
	case err != nil:
		return err.Error()
	}
	return otherwise
}
