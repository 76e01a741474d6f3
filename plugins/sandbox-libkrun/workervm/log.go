package workervm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// A worker's log lives on the host, in its state directory, so it outlives
// the VM: worker::logs of a worker that failed at boot or exited still
// shows why. It is JSON lines, one contract.WorkerLogEntry each, in
// worker.log; at logRotateBytes the file becomes worker.log.1 (the one
// before is dropped), so a worker keeps at most about twice that.
const (
	logName        = "worker.log"
	logRotateBytes = 4 << 20
	// maxLogLine cuts a line a worker writes without a newline, so one
	// endless line cannot hold output back or grow without bound.
	maxLogLine = 16 << 10
)

type logStore struct {
	path    string
	rotate  int64
	now     func() time.Time
	mu      sync.Mutex
	f       *os.File
	size    int64
	lastSeq uint64
}

// openLogStore opens the log in dir, finding the last seq written so
// numbering goes on across boots and adapter restarts.
func openLogStore(dir string, now func() time.Time) *logStore {
	l := &logStore{path: filepath.Join(dir, logName), rotate: logRotateBytes, now: now}
	for _, p := range []string{l.path, l.path + ".1"} {
		entries, _ := readLogFile(p)
		if n := len(entries); n > 0 {
			l.lastSeq = entries[n-1].Seq
			break
		}
	}
	return l
}

// add appends one entry. A log that cannot be written is not a reason to
// stop a worker; the error is returned for the caller to log once.
func (l *logStore) add(stream, message string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastSeq++
	e := contract.WorkerLogEntry{Seq: l.lastSeq, Time: l.now().UTC().Format(time.RFC3339Nano), Stream: stream, Message: message}
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if l.f == nil {
		if err := l.openLocked(); err != nil {
			return err
		}
	}
	if l.size > 0 && l.size+int64(len(line)) > l.rotate {
		_ = l.f.Close()
		l.f = nil
		if err := os.Rename(l.path, l.path+".1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("rotate %s: %w", l.path, err)
		}
		if err := l.openLocked(); err != nil {
			return err
		}
	}
	n, err := l.f.Write(line)
	l.size += int64(n)
	return err
}

func (l *logStore) openLocked() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open the worker log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return err
	}
	l.f, l.size = f, fi.Size()
	return nil
}

func (l *logStore) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
}

// read serves worker::logs: without cursor the last tail entries; with
// it, up to tail entries after the one it names.
func (l *logStore) read(tail uint64, cursor *uint64) (out []contract.WorkerLogEntry, next uint64, truncated, more bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var all []contract.WorkerLogEntry
	for _, p := range []string{l.path + ".1", l.path} {
		entries, err := readLogFile(p)
		if err != nil {
			return nil, 0, false, false, err
		}
		all = append(all, entries...)
	}
	return pageLog(all, tail, cursor)
}

// pageLog picks a page of entries (in seq order).
func pageLog(all []contract.WorkerLogEntry, tail uint64, cursor *uint64) (out []contract.WorkerLogEntry, next uint64, truncated, more bool, err error) {
	if cursor == nil {
		start := 0
		if uint64(len(all)) > tail {
			start = len(all) - int(tail)
		}
		out = all[start:]
		truncated = start > 0 || (len(all) > 0 && all[0].Seq > 1)
		if len(out) > 0 {
			next = out[len(out)-1].Seq
		}
		return out, next, truncated, false, nil
	}
	next = *cursor
	i := 0
	for i < len(all) && all[i].Seq <= *cursor {
		i++
	}
	rest := all[i:]
	// Entries between the cursor and the oldest one kept were rotated
	// away.
	truncated = len(rest) > 0 && rest[0].Seq > *cursor+1
	if uint64(len(rest)) > tail {
		rest, more = rest[:tail], true
	}
	if len(rest) > 0 {
		next = rest[len(rest)-1].Seq
	}
	return rest, next, truncated, more, nil
}

// readLogFile reads one log file; a missing file is empty. Lines that do
// not parse (a torn last write after a crash) are skipped.
func readLogFile(p string) ([]contract.WorkerLogEntry, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the worker log: %w", err)
	}
	var out []contract.WorkerLogEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if e, ok := parseLogLine(sc.Bytes()); ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// parseLogLine reads one entry of the log file.
func parseLogLine(line []byte) (contract.WorkerLogEntry, bool) {
	var e contract.WorkerLogEntry
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return e, false
	}
	if err := json.Unmarshal(line, &e); err != nil || e.Seq == 0 {
		return contract.WorkerLogEntry{}, false
	}
	switch e.Stream {
	case contract.LogStdout, contract.LogStderr, contract.LogSystem:
	default:
		return contract.WorkerLogEntry{}, false
	}
	return e, true
}

// lineSplitter turns a stream of output chunks into lines.
type lineSplitter struct {
	buf  []byte
	emit func(line string)
}

func (s *lineSplitter) write(p []byte) {
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			break
		}
		s.emit(string(bytes.TrimSuffix(s.buf[:i], []byte("\r"))))
		s.buf = s.buf[i+1:]
	}
	for len(s.buf) >= maxLogLine {
		s.emit(string(s.buf[:maxLogLine]))
		s.buf = s.buf[maxLogLine:]
	}
	if len(s.buf) == 0 {
		s.buf = nil
	}
}

// flush emits a last line that had no newline.
func (s *lineSplitter) flush() {
	if len(s.buf) > 0 {
		s.emit(string(s.buf))
		s.buf = nil
	}
}
