package proc

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func messages(es []Entry) []string {
	out := []string{}
	for _, e := range es {
		out = append(out, e.Message)
	}
	return out
}

func TestStripANSI(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"\x1b[31mred\x1b[0m text", "red text"},
		{"\x1b[1;32;40mbold\x1b[m", "bold"},
		{"\x1b]0;title\x07after", "after"},
		{"\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"},
		{"a\x1b(Bb", "ab"},
		{"cursor\x1b[2K\x1b[1Gline", "cursorline"},
		{"trailing escape\x1b", "trailing escape"},
		{"\x1b[", ""},
	}
	for _, tc := range tests {
		assert.Check(t, is.Equal(string(StripANSI([]byte(tc.in))), tc.want), "%q", tc.in)
	}
}

func FuzzStripANSI(f *testing.F) {
	f.Add([]byte("\x1b[31mred\x1b[0m"))
	f.Add([]byte("\x1b]0;t\x07x"))
	f.Add([]byte("\x1b"))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := StripANSI(b)
		if len(out) > len(b) {
			t.Fatal("stripping must not grow the input")
		}
		for _, c := range out {
			if c == 0x1b {
				t.Fatalf("escape left in %q -> %q", b, out)
			}
		}
	})
}

// Lines are recorded with their stream, escapes stripped; the tail and the
// stream filter read them back.
func TestLogTailAndStreamFilter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := OpenLog(dir, "api", LogOptions{})
	assert.NilError(t, err)
	for i := range 5 {
		s := Stdout
		if i%2 == 1 {
			s = Stderr
		}
		assert.NilError(t, l.Write(s, []byte(fmt.Sprintf("\x1b[32mline %d\x1b[0m\r\n", i))))
	}
	assert.NilError(t, l.Close())
	st, err := os.Stat(l.Path())
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	res, err := ReadLog(dir, "api", ReadOptions{Tail: 3})
	assert.NilError(t, err)
	assert.DeepEqual(t, messages(res.Entries), []string{"line 2", "line 3", "line 4"})
	assert.Check(t, res.Truncated)
	assert.Equal(t, res.Entries[1].Stream, Stderr)

	res, err = ReadLog(dir, "api", ReadOptions{Tail: 10, Stream: Stderr})
	assert.NilError(t, err)
	assert.DeepEqual(t, messages(res.Entries), []string{"line 1", "line 3"})
	assert.Check(t, !res.Truncated)

	res, err = ReadLog(dir, "api", ReadOptions{Tail: 2, Stream: Stderr})
	assert.NilError(t, err)
	assert.Check(t, !res.Truncated, "exactly the two stderr lines")

	missing, err := ReadLog(dir, "nobody", ReadOptions{Tail: 10})
	assert.NilError(t, err)
	assert.Equal(t, len(missing.Entries), 0)
	assert.Equal(t, missing.Cursor, Cursor{})
}

// The log rotates at MaxFileSize, keeps Archives archives, and cursors
// continue across generations; a cursor whose file was rotated away says
// so with Truncated.
func TestLogRotationAndCursors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := OpenLog(dir, "w", LogOptions{MaxFileSize: 100, Archives: 3})
	assert.NilError(t, err)
	defer l.Close()
	write := func(from, to int) {
		for i := from; i < to; i++ {
			assert.NilError(t, l.Write(Stdout, []byte(fmt.Sprintf("message %03d", i))))
		}
	}
	// Each record is 14 bytes: 7 per 100-byte file.
	write(0, 7)
	first, err := ReadLog(dir, "w", ReadOptions{Tail: 0})
	assert.NilError(t, err)
	assert.Equal(t, first.Cursor, Cursor{Generation: 0, Offset: 98})

	write(7, 20)
	res, err := ReadLog(dir, "w", ReadOptions{Cursor: &first.Cursor})
	assert.NilError(t, err)
	assert.Check(t, !res.Truncated)
	assert.Equal(t, len(res.Entries), 13)
	assert.Equal(t, res.Entries[0].Message, "message 007")
	assert.Equal(t, res.Cursor.Generation, int64(2))

	// A limit stops early; the cursor continues where it stopped.
	part, err := ReadLog(dir, "w", ReadOptions{Cursor: &first.Cursor, Limit: 5})
	assert.NilError(t, err)
	assert.DeepEqual(t, messages(part.Entries), []string{"message 007", "message 008", "message 009", "message 010", "message 011"})
	rest, err := ReadLog(dir, "w", ReadOptions{Cursor: &part.Cursor})
	assert.NilError(t, err)
	assert.Equal(t, rest.Entries[0].Message, "message 012")
	assert.Equal(t, rest.Cursor, res.Cursor)

	write(20, 60)
	ents, err := os.ReadDir(dir)
	assert.NilError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	assert.Equal(t, len(names), 4, "one active file and three archives: %v", names)
	assert.Check(t, is.Contains(names, "w.log"))

	lost, err := ReadLog(dir, "w", ReadOptions{Cursor: &first.Cursor})
	assert.NilError(t, err)
	assert.Check(t, lost.Truncated, "generation 0 was rotated away")
	assert.Check(t, strings.HasPrefix(lost.Entries[0].Message, "message"))

	tail, err := ReadLog(dir, "w", ReadOptions{Tail: 10})
	assert.NilError(t, err)
	assert.Equal(t, tail.Entries[9].Message, "message 059")
	assert.Equal(t, tail.Entries[0].Message, "message 050")

	// Reopening continues the same generation.
	l2, err := OpenLog(dir, "w", LogOptions{MaxFileSize: 100, Archives: 3})
	assert.NilError(t, err)
	assert.NilError(t, l2.Write(Stderr, []byte("after reopen")))
	assert.NilError(t, l2.Close())
	again, err := ReadLog(dir, "w", ReadOptions{Cursor: &tail.Cursor})
	assert.NilError(t, err)
	assert.DeepEqual(t, messages(again.Entries), []string{"after reopen"})
}

// Cursors the reader never handed out do not break it.
func TestReadLogOddCursors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := OpenLog(dir, "w", LogOptions{})
	assert.NilError(t, err)
	assert.NilError(t, l.Write(Stdout, []byte("one")))
	assert.NilError(t, l.Write(Stdout, []byte("two")))
	assert.NilError(t, l.Close())
	tests := []struct {
		name  string
		cur   Cursor
		want  []string
		trunc bool
	}{
		{"mid record", Cursor{0, 2}, []string{"two"}, false},
		{"past the end", Cursor{0, 1000}, []string{"one", "two"}, true},
		{"future generation", Cursor{7, 0}, []string{"one", "two"}, true},
		{"negative offset", Cursor{0, -1}, []string{"one", "two"}, true},
		{"end", Cursor{0, 12}, []string{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ReadLog(dir, "w", ReadOptions{Cursor: &tc.cur})
			assert.NilError(t, err)
			assert.DeepEqual(t, messages(res.Entries), tc.want)
			assert.Equal(t, res.Truncated, tc.trunc)
		})
	}
}

func TestParseRecord(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Entry
	}{
		{"o hello", Entry{Stdout, "hello"}},
		{"e oops", Entry{Stderr, "oops"}},
		{"e", Entry{Stderr, ""}},
		{"hand written", Entry{Stdout, "hand written"}},
		{"", Entry{Stdout, ""}},
	}
	for _, tc := range tests {
		assert.Check(t, is.DeepEqual(ParseRecord([]byte(tc.in)), tc.want), "%q", tc.in)
	}
}

func FuzzReadLog(f *testing.F) {
	f.Add([]byte("o one\ne two\n"), int64(0), int64(3), 2)
	f.Add([]byte("garbage without newline"), int64(0), int64(0), 0)
	f.Add([]byte("\n\n\n"), int64(-1), int64(99), 5)
	f.Fuzz(func(t *testing.T, content []byte, gen, off int64, tail int) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "w.log"), content, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadLog(dir, "w", ReadOptions{Tail: tail % 2000}); err != nil {
			t.Fatal(err)
		}
		res, err := ReadLog(dir, "w", ReadOptions{Cursor: &Cursor{gen, off}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Cursor.Offset < 0 || res.Cursor.Offset > int64(len(content)) {
			t.Fatalf("cursor %+v outside the file of %d bytes", res.Cursor, len(content))
		}
	})
}

// A line longer than one record is split, not lost.
func TestLongLinesAreSplit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := OpenLog(dir, "w", LogOptions{})
	assert.NilError(t, err)
	long := strings.Repeat("x", maxRecord+10)
	assert.NilError(t, l.Write(Stdout, []byte(long)))
	assert.NilError(t, l.Close())
	res, err := ReadLog(dir, "w", ReadOptions{Tail: 10})
	assert.NilError(t, err)
	assert.Equal(t, len(res.Entries), 2)
	assert.Equal(t, len(res.Entries[0].Message)+len(res.Entries[1].Message), len(long))
}

func TestOpenLogRejectsBadNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", ".", "..", "a/b"} {
		_, err := OpenLog(t.TempDir(), name, LogOptions{})
		assert.Check(t, err != nil, name)
	}
}
