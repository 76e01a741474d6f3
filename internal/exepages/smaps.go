package exepages

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maxSmapsLine bounds one line of /proc/<pid>/smaps (a path is at most
// PATH_MAX, 4096 bytes).
const maxSmapsLine = 8 << 10

// parseSmaps returns the read-only private mappings of the file whose
// inode is ino (and whose device, as smaps prints it, is dev) listed in the
// smaps text r.
func parseSmaps(r io.Reader, dev string, ino uint64) ([]Region, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxSmapsLine)
	var out []Region
	var cur *Region
	for sc.Scan() {
		line := sc.Bytes()
		if h, ok := parseHeader(line); ok {
			cur = nil
			if h.dev == dev && h.ino == ino && h.perms[1] == '-' && h.perms[3] == 'p' {
				out = append(out, Region{Start: h.start, End: h.end})
				cur = &out[len(out)-1]
			}
			continue
		}
		if cur == nil {
			continue
		}
		key, val, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *int64
		switch string(key) {
		case "Rss":
			dst = &cur.Resident
		case "Anonymous":
			// A copied-on-write page of a file mapping is anonymous.
			// Private_Dirty is no sign of one: a page of a file written
			// moments ago is dirty in the page cache, and private when
			// only this process maps it.
			dst = &cur.Private
		default:
			continue
		}
		kb, err := parseKB(val)
		if err != nil {
			return nil, fmt.Errorf("smaps: %s of the mapping at %#x: %w", key, cur.Start, err)
		}
		*dst = kb * 1024
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("smaps: %w", err)
	}
	return out, nil
}

type header struct {
	start, end uint64
	perms      string
	dev        string
	ino        uint64
}

// parseHeader parses a mapping's first line,
// "start-end perms offset dev inode [path]"; a field line ("Rss: 4 kB")
// is not one.
func parseHeader(line []byte) (header, bool) {
	f := strings.Fields(string(line))
	if len(f) < 5 {
		return header{}, false
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok || len(f[1]) != 4 {
		return header{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	ino, err3 := strconv.ParseUint(f[4], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || end <= start {
		return header{}, false
	}
	return header{start: start, end: end, perms: f[1], dev: f[3], ino: ino}, true
}

// parseKB parses " 1234 kB".
func parseKB(v []byte) (int64, error) {
	s := strings.TrimSpace(string(v))
	s, ok := strings.CutSuffix(s, " kB")
	if !ok {
		return 0, fmt.Errorf("%q is not a size in kB", string(v))
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 || n > 1<<40 {
		return 0, fmt.Errorf("%q is not a size in kB", string(v))
	}
	return n, nil
}
