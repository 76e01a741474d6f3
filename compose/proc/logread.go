package proc

import (
	"bytes"
	"errors"
	"io"
	"os"
)

// Cursor is a position in a log: a generation (file) and a byte offset in
// it. compose::logs hands it out and takes it back to continue reading.
type Cursor struct {
	Generation int64 `json:"generation"`
	Offset     int64 `json:"offset"`
}

// Entry is one recorded line.
type Entry struct {
	Stream  Stream `json:"stream"`
	Message string `json:"message"`
}

// ReadOptions select what ReadLog returns.
type ReadOptions struct {
	// Tail is how many of the newest entries to return when Cursor is nil.
	Tail int
	// Cursor continues from an earlier read: entries after it, oldest
	// first, at most Limit.
	Cursor *Cursor
	// Limit bounds the entries of a cursor read (default 1000).
	Limit int
	// Stream keeps only that stream's entries ("" = both).
	Stream Stream
}

// ReadResult is a read's entries, the cursor to continue from, and whether
// entries were skipped before the first one returned (older entries beyond
// the tail, or entries rotated away since the cursor was handed out).
type ReadResult struct {
	Entries   []Entry
	Cursor    Cursor
	Truncated bool
}

// DefaultReadLimit bounds a cursor read.
const DefaultReadLimit = 1000

// generation is one file of a log.
type generation struct {
	gen  int64
	path string
}

// generations lists the files of a log, oldest first; the last is the
// active file (which may not exist yet).
func generations(dir, name string) ([]generation, error) {
	gens, err := archives(dir, name)
	if err != nil {
		return nil, err
	}
	out := make([]generation, 0, len(gens)+1)
	active := int64(0)
	for _, g := range gens {
		out = append(out, generation{g, archivePath(dir, name, g)})
		active = g + 1
	}
	return append(out, generation{active, activePath(dir, name)}), nil
}

// readFile returns a file's content from off, cut after the last complete
// record; a missing file is empty.
func readFile(path string, off int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	if off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return nil, err
		}
	}
	data, err := io.ReadAll(io.LimitReader(f, 4*DefaultMaxFileSize))
	if err != nil {
		return nil, err
	}
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		return data[:i+1], nil
	}
	return nil, nil
}

// ParseRecord decodes one record line (without its newline). A line that
// is not in the tagged form is taken as stdout text, whole.
func ParseRecord(line []byte) Entry {
	if len(line) >= 2 && line[1] == ' ' {
		switch line[0] {
		case 'o':
			return Entry{Stream: Stdout, Message: string(line[2:])}
		case 'e':
			return Entry{Stream: Stderr, Message: string(line[2:])}
		}
	}
	if len(line) == 1 && (line[0] == 'o' || line[0] == 'e') {
		s := Stdout
		if line[0] == 'e' {
			s = Stderr
		}
		return Entry{Stream: s}
	}
	return Entry{Stream: Stdout, Message: string(line)}
}

// records splits complete records.
func records(data []byte, fn func(rec []byte, end int) bool) {
	pos := 0
	for pos < len(data) {
		i := bytes.IndexByte(data[pos:], '\n')
		if i < 0 {
			return
		}
		if !fn(data[pos:pos+i], pos+i+1) {
			return
		}
		pos += i + 1
	}
}

func (o ReadOptions) keep(e Entry) bool { return o.Stream == "" || e.Stream == o.Stream }

// ReadLog reads the log name in dir (see ReadOptions). A log that does not
// exist reads as empty.
func ReadLog(dir, name string, opts ReadOptions) (ReadResult, error) {
	if err := checkLogName(name); err != nil {
		return ReadResult{}, err
	}
	gens, err := generations(dir, name)
	if err != nil {
		return ReadResult{}, err
	}
	if opts.Cursor == nil {
		return readTail(gens, opts)
	}
	return readFrom(gens, *opts.Cursor, opts)
}

func readTail(gens []generation, opts ReadOptions) (ReadResult, error) {
	active := gens[len(gens)-1]
	res := ReadResult{Entries: []Entry{}, Cursor: Cursor{Generation: active.gen}}
	tail := max(opts.Tail, 0)
	var newest [][]Entry // per file, newest file first
	count := 0
	for i := len(gens) - 1; i >= 0; i-- {
		data, err := readFile(gens[i].path, 0)
		if err != nil {
			return ReadResult{}, err
		}
		if i == len(gens)-1 {
			res.Cursor.Offset = int64(len(data))
		}
		var es []Entry
		records(data, func(rec []byte, _ int) bool {
			if e := ParseRecord(rec); opts.keep(e) {
				es = append(es, e)
			}
			return true
		})
		if count+len(es) > tail {
			es = es[len(es)-(tail-count):]
			res.Truncated = true
		}
		newest = append(newest, es)
		count += len(es)
		if count >= tail {
			if !res.Truncated {
				// Exactly tail entries so far: anything older is cut.
				for j := i - 1; j >= 0 && !res.Truncated; j-- {
					d, err := readFile(gens[j].path, 0)
					if err != nil {
						return ReadResult{}, err
					}
					records(d, func(rec []byte, _ int) bool {
						if opts.keep(ParseRecord(rec)) {
							res.Truncated = true
							return false
						}
						return true
					})
				}
			}
			break
		}
	}
	for i := len(newest) - 1; i >= 0; i-- {
		res.Entries = append(res.Entries, newest[i]...)
	}
	return res, nil
}

func readFrom(gens []generation, cur Cursor, opts ReadOptions) (ReadResult, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	res := ReadResult{Entries: []Entry{}}
	oldest, active := gens[0], gens[len(gens)-1]
	idx := -1
	for i, g := range gens {
		if g.gen == cur.Generation {
			idx = i
		}
	}
	if idx < 0 || cur.Offset < 0 {
		// Rotated away (older than the oldest archive), or a log that was
		// reset (newer than the active file): start over from the oldest.
		res.Truncated = cur.Generation < oldest.gen || cur.Generation > active.gen || cur.Offset < 0
		idx, cur = 0, Cursor{Generation: oldest.gen}
	}
	for i := idx; i < len(gens); i++ {
		g := gens[i]
		off := int64(0)
		if g.gen == cur.Generation {
			off = cur.Offset
		}
		st, err := os.Stat(g.path)
		size := int64(0)
		if err == nil {
			size = st.Size()
		} else if !errors.Is(err, os.ErrNotExist) {
			return ReadResult{}, err
		}
		if off > size {
			// The file is shorter than the cursor: it was replaced.
			res.Truncated = true
			off = 0
		}
		data, err := readFile(g.path, off)
		if err != nil {
			return ReadResult{}, err
		}
		if off > 0 && !endsRecord(g.path, off) {
			// Not a record boundary (a cursor we did not hand out): resume
			// at the next record.
			j := bytes.IndexByte(data, '\n')
			if j < 0 {
				data = nil
			} else {
				off += int64(j + 1)
				data = data[j+1:]
			}
		}
		pos := off
		full := false
		records(data, func(rec []byte, end int) bool {
			if len(res.Entries) >= limit {
				full = true
				return false
			}
			if e := ParseRecord(rec); opts.keep(e) {
				res.Entries = append(res.Entries, e)
			}
			pos = off + int64(end)
			return true
		})
		res.Cursor = Cursor{Generation: g.gen, Offset: pos}
		if full {
			break
		}
	}
	return res, nil
}

// endsRecord reports whether the byte before off in path is a newline.
func endsRecord(path string, off int64) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off-1); err != nil {
		return false
	}
	return b[0] == '\n'
}

// TailLines returns up to n of the newest lines of a log, as text, for
// error messages (a worker that exited before registering, an engine that
// exited).
func TailLines(dir, name string, n int) []string {
	res, err := ReadLog(dir, name, ReadOptions{Tail: n})
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(res.Entries))
	for _, e := range res.Entries {
		out = append(out, e.Message)
	}
	return out
}
