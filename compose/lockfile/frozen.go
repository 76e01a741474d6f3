package lockfile

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
)

// PackageKeys lists f's package:// containers in file order.
func PackageKeys(f *composefile.File) []string {
	var out []string
	for _, key := range f.Order {
		if f.Containers[key].Source.Kind == composefile.SourcePackage {
			out = append(out, key)
		}
	}
	return out
}

// CheckFrozen applies --frozen: the lock l read from path (nil when there
// is none) must lock exactly f's package:// containers, each for the worker
// and selector the file declares. A frozen start never resolves and never
// writes, so anything else is an error: COMPOSE_LOCK_REQUIRED without a
// lock, COMPOSE_LOCK_OUT_OF_DATE naming every difference. A file with no
// package:// container needs no lock.
func CheckFrozen(f *composefile.File, l *Lock, path string) error {
	keys := PackageKeys(f)
	if l == nil {
		if len(keys) == 0 {
			return nil
		}
		return compose.New(compose.CodeComposeLockRequired, fmt.Sprintf(
			"%s declares package:// containers (%s) but there is no lock %s, and --frozen never resolves versions nor writes the lock; "+
				"run `iii compose build` (or `iii compose --up`) once without --frozen, then commit %s with the compose file",
			f.Path, strings.Join(keys, ", "), path, filepath.Base(path)))
	}
	var problems []string
	declared := map[string]bool{}
	for _, key := range keys {
		declared[key] = true
		c := f.Containers[key]
		e := l.Containers[key]
		switch {
		case e == nil:
			problems = append(problems, fmt.Sprintf("container %q (%s) is not in the lock", key, c.Worker))
		case e.Worker != c.Worker:
			problems = append(problems, fmt.Sprintf("container %q is locked for worker %s but the compose file says %s", key, e.Worker, c.Worker))
		case e.Requested != RequestedOf(c.Version):
			problems = append(problems, fmt.Sprintf("container %q is locked for version %q but the compose file says %q", key, e.Requested, RequestedOf(c.Version)))
		}
	}
	for _, key := range sortedKeys(l.Containers) {
		if !declared[key] {
			problems = append(problems, fmt.Sprintf("the lock has container %q, which the compose file does not declare as a package:// container", key))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return compose.New(compose.CodeComposeLockOutOfDate, fmt.Sprintf(
		"%s does not match %s: %s. --frozen never resolves versions nor writes the lock; run `iii compose build` (or `iii compose --up`) without --frozen to update it, then commit both files",
		path, f.Path, strings.Join(problems, "; ")))
}
