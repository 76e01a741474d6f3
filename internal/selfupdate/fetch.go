package selfupdate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"

	"github.com/iii-sandbox/iii/compose/packages"
	"github.com/iii-sandbox/iii/internal/download"
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
			return nil, unreachable("GET %s failed: %v", where, download.UnwrapURL(err))
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, unreachable("GET %s answered %s", where, resp.Status)
		}
		if data, err = io.ReadAll(io.LimitReader(resp.Body, MaxIndexBytes+1)); err != nil {
			return nil, unreachable("reading %s failed: %v", where, download.UnwrapURL(err))
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
	meter := &download.Meter{Total: total, Steps: progressSteps, Report: func(n int64) {
		f.report(packages.Event{Phase: packages.PhaseProgress, Package: label, Target: target, Bytes: n, Total: total})
	}}
	n, sum, err := download.Copy(dst, body, limit, meter)
	if err != nil {
		if ctx.Err() != nil {
			return newError(CodeDownloadFailed, fmt.Sprintf("the download of %s from %s was interrupted (%v); nothing was changed", label, u, ctx.Err()))
		}
		return newError(CodeDownloadFailed, fmt.Sprintf("the download of %s from %s failed after %d bytes: %v; nothing was changed", label, u, n, download.UnwrapURL(err)))
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
	if sum != a.SHA256 {
		return mismatch("its sha256 is " + sum)
	}
	f.report(packages.Event{Phase: packages.PhaseVerified, Package: label, Target: target, Bytes: n, Total: n})
	return nil
}

// open starts reading an asset URL (http, https or file); total is its
// length when known.
func (f *fetcher) open(ctx context.Context, raw, label string) (io.ReadCloser, int64, error) {
	body, total, err := download.Open(ctx, f.http, raw, DownloadTimeout)
	if err != nil {
		return nil, 0, newError(CodeDownloadFailed, fmt.Sprintf("the download of %s from %s failed: %v; nothing was changed", label, raw, err))
	}
	return body, total, nil
}

// progressSteps bounds the progress events of a download of known size
// (see download.Meter).
const progressSteps = 100

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
