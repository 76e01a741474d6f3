package packages

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// Phase is a step of one install.
type Phase string

// The phases an Installer reports, in the order they happen.
const (
	// PhaseReused: the cache entry was there and checked out intact.
	PhaseReused Phase = "reused"
	// PhaseStale: the cache entry was there but not intact (Detail says
	// why); it is downloaded again.
	PhaseStale Phase = "stale"
	// PhaseDownload: a download starts (Total may be 0: unknown).
	PhaseDownload Phase = "download"
	// PhaseProgress: Bytes of Total were downloaded.
	PhaseProgress Phase = "progress"
	// PhaseVerified: the download is complete and its digest matched.
	PhaseVerified Phase = "verified"
	// PhaseInstalled: the entry is in the cache.
	PhaseInstalled Phase = "installed"
)

// Event is one progress report.
type Event struct {
	Phase   Phase
	Package string // "name version"
	Target  string
	URL     string
	Dir     string
	Bytes   int64
	Total   int64
	Detail  string
}

// Progress receives events; it is called from the installing goroutine.
type Progress func(Event)

// progressSteps is how many progress events a download of known size
// sends at most (see download.Meter).
const progressSteps = 50

// IsTerminal reports whether f is a character device (a terminal), where
// a redrawn progress bar makes sense.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Printer renders events for people: on a terminal one redrawn bar per
// download; elsewhere (logs, CI) plain lines at the start, at each quarter
// and at the end.
func Printer(w io.Writer, terminal bool) Progress {
	var mu sync.Mutex
	quarter := -1
	drawn := false
	return func(ev Event) {
		mu.Lock()
		defer mu.Unlock()
		switch ev.Phase {
		case PhaseReused:
			fmt.Fprintf(w, "%s (%s): in the package cache, verified\n", ev.Package, ev.Target)
		case PhaseStale:
			fmt.Fprintf(w, "%s (%s): the cached copy in %s is not intact (%s); downloading it again\n", ev.Package, ev.Target, ev.Dir, ev.Detail)
		case PhaseDownload:
			quarter, drawn = -1, false
			size := "size unknown"
			if ev.Total > 0 {
				size = human(ev.Total)
			}
			if !terminal {
				fmt.Fprintf(w, "%s (%s): downloading %s from %s\n", ev.Package, ev.Target, size, ev.URL)
			}
		case PhaseProgress:
			if terminal {
				fmt.Fprintf(w, "\r%s", bar(ev))
				drawn = true
				return
			}
			if ev.Total > 0 {
				q := int(ev.Bytes * 4 / ev.Total)
				if q > quarter && q > 0 && q < 4 {
					quarter = q
					fmt.Fprintf(w, "%s (%s): %d%% (%s of %s)\n", ev.Package, ev.Target, q*25, human(ev.Bytes), human(ev.Total))
				}
			}
		case PhaseVerified:
			if terminal {
				if drawn {
					fmt.Fprintf(w, "\r%s\n", bar(ev))
				}
				drawn = false
			}
			fmt.Fprintf(w, "%s (%s): downloaded %s, sha256 verified\n", ev.Package, ev.Target, human(ev.Bytes))
		case PhaseInstalled:
			fmt.Fprintf(w, "%s (%s): installed in %s\n", ev.Package, ev.Target, ev.Dir)
		}
	}
}

func bar(ev Event) string {
	const width = 30
	if ev.Total <= 0 {
		return fmt.Sprintf("%s %s", ev.Package, human(ev.Bytes))
	}
	frac := float64(ev.Bytes) / float64(ev.Total)
	frac = min(max(frac, 0), 1)
	n := int(frac * width)
	return fmt.Sprintf("%s [%s%s] %3d%% %s/%s", ev.Package, strings.Repeat("=", n), strings.Repeat(" ", width-n), int(frac*100), human(ev.Bytes), human(ev.Total))
}

func human(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
