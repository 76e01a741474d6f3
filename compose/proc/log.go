package proc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Log sizes of spec §5.7: 10 MiB per file, one active file and three
// archives (at most 40 MiB per log).
const (
	DefaultMaxFileSize = 10 << 20
	DefaultArchives    = 3
	// maxRecord bounds one record; a longer line is split.
	maxRecord = 64 << 10
)

// Stream names a process output stream.
type Stream string

// The two streams a log records.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// On disk every record is one line: a stream tag ('o' or 'e'), a space, and
// the text with terminal escapes removed. The tag keeps the stream filter
// of compose::logs exact; the file stays readable with less or tail.
func tagOf(s Stream) byte {
	if s == Stderr {
		return 'e'
	}
	return 'o'
}

// LogOptions size a log; zero values take the defaults.
type LogOptions struct {
	MaxFileSize int64
	Archives    int
}

func (o LogOptions) withDefaults() LogOptions {
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = DefaultMaxFileSize
	}
	if o.Archives <= 0 {
		o.Archives = DefaultArchives
	}
	return o
}

// Log is a rotating log of one process's output: <dir>/<name>.log is the
// active file; when it would grow past MaxFileSize it becomes
// <name>.log.<generation> and a new active file starts with the next
// generation. Only the newest Archives archives are kept.
type Log struct {
	dir, name string
	opts      LogOptions

	mu      sync.Mutex
	f       *os.File
	size    int64
	gen     int64
	closed  bool
	changed chan struct{}
}

// OpenLog opens (creating, owner-only) the log name in dir, appending to
// its active file.
func OpenLog(dir, name string, opts LogOptions) (*Log, error) {
	if err := checkLogName(name); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	l := &Log{dir: dir, name: name, opts: opts.withDefaults(), changed: make(chan struct{})}
	gens, err := archives(dir, name)
	if err != nil {
		return nil, err
	}
	if len(gens) > 0 {
		l.gen = gens[len(gens)-1] + 1
	}
	if err := l.openActive(); err != nil {
		return nil, err
	}
	return l, nil
}

func checkLogName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") {
		return fmt.Errorf("invalid log name %q", name)
	}
	return nil
}

func (l *Log) openActive() error {
	f, err := os.OpenFile(l.Path(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Path is the active file.
func (l *Log) Path() string { return activePath(l.dir, l.name) }

// Dir and Name locate the log for ReadLog.
func (l *Log) Dir() string  { return l.dir }
func (l *Log) Name() string { return l.name }

func activePath(dir, name string) string { return filepath.Join(dir, name+".log") }

func archivePath(dir, name string, gen int64) string {
	return filepath.Join(dir, name+".log."+strconv.FormatInt(gen, 10))
}

// archives lists the generations of the archives of name, oldest first.
func archives(dir, name string) ([]int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	prefix := name + ".log."
	var gens []int64
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || rest == "" || strings.TrimLeft(rest, "0123456789") != "" {
			continue
		}
		g, err := strconv.ParseInt(rest, 10, 64)
		if err != nil || g < 0 {
			continue
		}
		gens = append(gens, g)
	}
	slices.Sort(gens)
	return gens, nil
}

// Changed is closed at the next write; followers wait on it.
func (l *Log) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Write records one line of stream (a trailing newline is dropped;
// escapes are stripped; a very long line becomes several records).
func (l *Log) Write(stream Stream, line []byte) error {
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	line = StripANSI(line)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return os.ErrClosed
	}
	for first := true; first || len(line) > 0; first = false {
		chunk := line
		if len(chunk) > maxRecord {
			chunk = chunk[:maxRecord]
		}
		line = line[len(chunk):]
		rec := make([]byte, 0, len(chunk)+3)
		rec = append(rec, tagOf(stream), ' ')
		rec = append(rec, chunk...)
		rec = append(rec, '\n')
		// A stray newline inside a record (none can come from copyFrom,
		// but Write is public) would split it; make it a space.
		for i := 2; i < len(rec)-1; i++ {
			if rec[i] == '\n' {
				rec[i] = ' '
			}
		}
		if err := l.writeLocked(rec); err != nil {
			return err
		}
	}
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

func (l *Log) writeLocked(rec []byte) error {
	if l.size > 0 && l.size+int64(len(rec)) > l.opts.MaxFileSize {
		if err := l.rotateLocked(); err != nil {
			return err
		}
	}
	n, err := l.f.Write(rec)
	l.size += int64(n)
	return err
}

func (l *Log) rotateLocked() error {
	if err := l.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(l.Path(), archivePath(l.dir, l.name, l.gen)); err != nil {
		return err
	}
	gens, err := archives(l.dir, l.name)
	if err == nil && len(gens) > l.opts.Archives {
		for _, g := range gens[:len(gens)-l.opts.Archives] {
			_ = os.Remove(archivePath(l.dir, l.name, g))
		}
	}
	l.gen++
	return l.openActive()
}

// copyFrom records r line by line until EOF (or until r is closed).
func (l *Log) copyFrom(stream Stream, r io.ReadCloser) {
	defer r.Close()
	br := bufio.NewReaderSize(r, maxRecord)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			_ = l.Write(stream, line)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// Close closes the active file; later writes fail.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.changed)
	return l.f.Close()
}
