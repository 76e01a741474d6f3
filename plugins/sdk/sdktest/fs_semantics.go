package sdktest

import (
	"strings"
	"testing"

	"github.com/iii-sandbox/iii/contract"
)

// testFsSemantics pins the filesystem behaviour every adapter must share,
// down to the messages, where adapters used to differ: sed over whole
// files, atomic rewrites, glob spelling and limits, mv across file types
// and filesystems, what rm / and mkdir -p over a file are, line endings,
// and symbolic links inside the sandbox.
func (s *suite) testFsSemantics(t *testing.T) {
	ss := s.session(t)
	id := s.create(ss, nil)
	with := func(payload map[string]any) map[string]any {
		return Merge(map[string]any{"sandbox_id": id}, payload)
	}
	write := func(ss *session, p, content string, extra map[string]any) {
		ss.t.Helper()
		ss.call(contract.OpFsWrite, with(Merge(map[string]any{"path": p, "content": content, "parents": true}, extra)), nil)
	}
	message := func(t *testing.T, e *contract.Error, want string) {
		t.Helper()
		if e.Message != want {
			t.Errorf("%s message %q, want %q", e.Code, e.Message, want)
		}
	}

	t.Run("symbolic link inside the sandbox is followed", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/ln/target.txt", "through the link", nil)
		out := ss.sh(id, "ln -s target.txt link", map[string]any{"workdir": "/sdk/sem/ln"})
		if out.ExitCode == nil || *out.ExitCode != 0 {
			t.Fatalf("ln -s: %s", js(out))
		}
		var st contract.FsEntry
		ss.call(contract.OpFsStat, with(map[string]any{"path": "/sdk/sem/ln/link"}), &st)
		if !st.IsSymlink {
			t.Errorf("stat of a symbolic link describes the link itself: %s", js(st))
		}
		s.expectFile(t, id, "/sdk/sem/ln/link", "through the link")
		var g contract.FsGrepResponse
		ss.call(contract.OpFsGrep, with(map[string]any{"path": "/sdk/sem/ln", "pattern": "link"}), &g)
		if grepSummary(g) != "/sdk/sem/ln/target.txt:1:through the link" {
			t.Errorf("grep walks past symbolic links: %s", grepSummary(g))
		}
	})

	t.Run("sed matches over the whole file", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/sed/a.txt", "foo\nfoo\nend\n", nil)
		var out contract.FsSedResponse
		ss.call(contract.OpFsSed, with(map[string]any{"files": []string{"/sdk/sem/sed/a.txt"}, "pattern": "^foo", "replacement": "bar"}), &out)
		if out.TotalReplacements != 1 {
			t.Errorf("^ anchors at the start of the file: %d replacements", out.TotalReplacements)
		}
		s.expectFile(t, id, "/sdk/sem/sed/a.txt", "bar\nfoo\nend\n")
		ss.call(contract.OpFsSed, with(map[string]any{"files": []string{"/sdk/sem/sed/a.txt"}, "pattern": "(?m)^(\\w+)$", "replacement": "<$1>"}), &out)
		if out.TotalReplacements != 3 {
			t.Errorf("(?m) makes ^ and $ anchor at lines: %d replacements", out.TotalReplacements)
		}
		s.expectFile(t, id, "/sdk/sem/sed/a.txt", "<bar>\n<foo>\n<end>\n")
		ss.call(contract.OpFsSed, with(map[string]any{"files": []string{"/sdk/sem/sed/a.txt"}, "pattern": ">\\n<foo", "replacement": "+"}), &out)
		if out.TotalReplacements != 1 {
			t.Errorf("a match may span lines: %d replacements", out.TotalReplacements)
		}
		s.expectFile(t, id, "/sdk/sem/sed/a.txt", "<bar+>\n<end>\n")
	})

	t.Run("sed over a directory reports changed files sorted by path", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/sort/a/b.txt", "x\n", nil)
		write(ss, "/sdk/sem/sort/a.txt", "x\n", nil)
		write(ss, "/sdk/sem/sort/c.txt", "unchanged\n", nil)
		write(ss, "/sdk/sem/sort/0.txt", "x\n", map[string]any{"mode": "0751"})
		var out contract.FsSedResponse
		raw := ss.call(contract.OpFsSed, with(map[string]any{"path": "/sdk/sem/sort", "pattern": "x", "replacement": "y"}), &out)
		var paths []string
		for _, r := range out.Results {
			paths = append(paths, r.Path)
			if !r.Success || r.Replacements != 1 || r.Error != "" {
				t.Errorf("result %s", js(r))
			}
		}
		if strings.Join(paths, ",") != "/sdk/sem/sort/0.txt,/sdk/sem/sort/a.txt,/sdk/sem/sort/a/b.txt" || out.TotalReplacements != 3 {
			t.Errorf("sed over a directory: %s", raw)
		}
		var st contract.FsEntry
		ss.call(contract.OpFsStat, with(map[string]any{"path": "/sdk/sem/sort/0.txt"}), &st)
		if st.Mode != 0o751 {
			t.Errorf("sed's rewrite keeps the mode: %s", st.Mode)
		}
		var ls contract.FsLsResponse
		ss.call(contract.OpFsLs, with(map[string]any{"path": "/sdk/sem/sort"}), &ls)
		var names []string
		for _, e := range ls.Entries {
			names = append(names, e.Name)
		}
		if strings.Join(names, ",") != "0.txt,a,a.txt,c.txt" {
			t.Errorf("sed left files behind: %v", names)
		}
		// A file sed does not change is not reported, and nothing is
		// reported when nothing changes.
		ss.call(contract.OpFsSed, with(map[string]any{"path": "/sdk/sem/sort/c.txt", "pattern": "absent", "replacement": "y"}), &out)
		if len(out.Results) != 0 || out.TotalReplacements != 0 {
			t.Errorf("sed over a path that does not change: %s", js(out))
		}
		ss.call(contract.OpFsSed, with(map[string]any{"files": []string{"/sdk/sem/sort/missing"}, "pattern": "x", "replacement": "y"}), &out)
		if len(out.Results) != 1 || out.Results[0].Success || out.Results[0].Error != "S211: path not found: /sdk/sem/sort/missing" {
			t.Errorf("sed over a missing file: %s", js(out.Results))
		}
	})

	t.Run("globs", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/glob/src/x.go", "TODO\n", nil)
		write(ss, "/sdk/sem/glob/x.go", "TODO\n", nil)
		var g contract.FsGrepResponse
		ss.call(contract.OpFsGrep, with(map[string]any{"path": "/sdk/sem/glob", "pattern": "TODO", "include_glob": []string{"src//*.go"}}), &g)
		if grepSummary(g) != "/sdk/sem/glob/src/x.go:1:TODO" {
			t.Errorf("the glob src//*.go is src/*.go: %s", grepSummary(g))
		}
		ss.call(contract.OpFsGrep, with(map[string]any{"path": "/sdk/sem/glob", "pattern": "TODO", "exclude_glob": []string{strings.Repeat("y", 1024)}}), &g)
		if len(g.Matches) != 2 {
			t.Errorf("a 1024-byte glob is accepted: %s", grepSummary(g))
		}
		long := strings.Repeat("z", 1025)
		e := ss.fail(contract.OpFsGrep, with(map[string]any{"path": "/sdk/sem/glob", "pattern": "TODO", "include_glob": []string{long}}), contract.S210)
		message(t, e, `invalid sandbox::fs::grep request: include_glob: glob "`+strings.Repeat("z", 32)+`"… is longer than 1024 bytes`)
		e = ss.fail(contract.OpFsSed, with(map[string]any{"path": "/sdk/sem/glob", "pattern": "TODO", "replacement": "x", "exclude_glob": []string{long}}), contract.S210)
		message(t, e, `invalid sandbox::fs::sed request: exclude_glob: glob "`+strings.Repeat("z", 32)+`"… is longer than 1024 bytes`)
	})

	t.Run("write replaces the file with a new one", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/w/f", "old", nil)
		out := ss.sh(id, "ln f hard || exit 77", map[string]any{"workdir": "/sdk/sem/w"})
		write(ss, "/sdk/sem/w/f", "new", map[string]any{"mode": "0600"})
		s.expectFile(t, id, "/sdk/sem/w/f", "new")
		var st contract.FsEntry
		ss.call(contract.OpFsStat, with(map[string]any{"path": "/sdk/sem/w/f"}), &st)
		if st.Mode != 0o600 {
			t.Errorf("write applies its mode to an existing file: %s", st.Mode)
		}
		if out.ExitCode != nil && *out.ExitCode == 0 {
			// A hard link to the old file keeps the old content: the
			// write made a new inode rather than truncating the old.
			s.expectFile(t, id, "/sdk/sem/w/hard", "old")
		}
		var ls contract.FsLsResponse
		ss.call(contract.OpFsLs, with(map[string]any{"path": "/sdk/sem/w"}), &ls)
		for _, e := range ls.Entries {
			if e.Name != "f" && e.Name != "hard" {
				t.Errorf("write left %s behind", e.Name)
			}
		}
	})

	t.Run("mv", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/mv/file", "f", nil)
		ss.call(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/sem/mv/dir", "parents": true}), nil)
		e := ss.fail(contract.OpFsMv, with(map[string]any{"src": "/sdk/sem/mv/file", "dst": "/sdk/sem/mv/dir", "overwrite": true}), contract.S212)
		message(t, e, "is a directory: /sdk/sem/mv/dir cannot be replaced by the file /sdk/sem/mv/file")
		e = ss.fail(contract.OpFsMv, with(map[string]any{"src": "/sdk/sem/mv/dir", "dst": "/sdk/sem/mv/file", "overwrite": true}), contract.S212)
		message(t, e, "not a directory: /sdk/sem/mv/file cannot be replaced by the directory /sdk/sem/mv/dir")
		e = ss.fail(contract.OpFsMv, with(map[string]any{"src": "/sdk/sem/mv/file", "dst": "/sdk/sem/mv/nowhere/file"}), contract.S211)
		message(t, e, "parent directory not found: /sdk/sem/mv/nowhere/file")
		if e.Fix != nil {
			t.Errorf("mv has no parents field, so its S211 has no fix: %v", e.Fix)
		}

		// /tmp is another filesystem in some sandboxes (a tmpfs in a VM):
		// mv copies across, keeping contents and modes.
		write(ss, "/tmp/sdk-sem-mv/sub/f", "across", map[string]any{"mode": "0640"})
		ss.call(contract.OpFsMv, with(map[string]any{"src": "/tmp/sdk-sem-mv", "dst": "/sdk/sem/mv/across"}), nil)
		s.expectFile(t, id, "/sdk/sem/mv/across/sub/f", "across")
		var st contract.FsEntry
		ss.call(contract.OpFsStat, with(map[string]any{"path": "/sdk/sem/mv/across/sub/f"}), &st)
		if st.Mode != 0o640 {
			t.Errorf("mv across filesystems keeps the mode: %s", st.Mode)
		}
		ss.fail(contract.OpFsStat, with(map[string]any{"path": "/tmp/sdk-sem-mv"}), contract.S211)
		ss.call(contract.OpFsMv, with(map[string]any{"src": "/sdk/sem/mv/across/sub/f", "dst": "/tmp/sdk-sem-mv-f"}), nil)
		s.expectFile(t, id, "/tmp/sdk-sem-mv-f", "across")
		ss.call(contract.OpFsRm, with(map[string]any{"path": "/tmp/sdk-sem-mv-f"}), nil)
	})

	t.Run("rm of the root is an invalid request", func(t *testing.T) {
		ss := s.session(t)
		for _, recursive := range []bool{false, true} {
			e := ss.fail(contract.OpFsRm, with(map[string]any{"path": "/", "recursive": recursive}), contract.S210)
			message(t, e, "invalid sandbox::fs::rm request: the sandbox's root directory cannot be removed")
		}
		ss.fail(contract.OpFsRm, with(map[string]any{"path": "/sdk/..", "recursive": true}), contract.S210)
		var st contract.FsEntry
		ss.call(contract.OpFsStat, with(map[string]any{"path": "/"}), &st)
	})

	t.Run("mkdir over a file", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/mk/file", "f", nil)
		e := ss.fail(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/sem/mk/file", "parents": true}), contract.S212)
		message(t, e, "not a directory: /sdk/sem/mk/file, or one of its parents, is a file")
		e = ss.fail(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/sem/mk/file/sub/dir", "parents": true}), contract.S212)
		message(t, e, "not a directory: /sdk/sem/mk/file/sub/dir, or one of its parents, is a file")
		e = ss.fail(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/sem/mk/file"}), contract.S213)
		message(t, e, "path already exists: /sdk/sem/mk/file")
		e = ss.fail(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/sem/mk"}), contract.S213)
		message(t, e, "path already exists: /sdk/sem/mk")
		e = ss.fail(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/sem/mk/no/dir"}), contract.S211)
		message(t, e, "parent directory not found: /sdk/sem/mk/no/dir")
	})

	t.Run("grep strips a carriage return ending a line", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/crlf.txt", "one TODO\r\ntwo\r\nlast TODO\r", nil)
		var g contract.FsGrepResponse
		ss.call(contract.OpFsGrep, with(map[string]any{"path": "/sdk/sem/crlf.txt", "pattern": "TODO$"}), &g)
		if grepSummary(g) != "/sdk/sem/crlf.txt:1:one TODO|/sdk/sem/crlf.txt:3:last TODO" {
			t.Errorf("grep over CRLF lines: %q", grepSummary(g))
		}
	})

	t.Run("messages", func(t *testing.T) {
		ss := s.session(t)
		write(ss, "/sdk/sem/msg/file", "f", nil)
		tests := []struct {
			op      string
			payload map[string]any
			code    contract.Code
			want    string
		}{
			{contract.OpFsStat, map[string]any{"path": "/sdk/sem/msg/none"}, contract.S211, "path not found: /sdk/sem/msg/none"},
			{contract.OpFsWrite, map[string]any{"path": "/sdk/sem/msg/no/f", "content": "x"}, contract.S211, "parent directory not found: /sdk/sem/msg/no/f"},
			{contract.OpFsLs, map[string]any{"path": "/sdk/sem/msg/file"}, contract.S212, "not a directory: /sdk/sem/msg/file (use sandbox::fs::stat for a file)"},
			{contract.OpFsRead, map[string]any{"path": "/sdk/sem/msg"}, contract.S212, "is a directory: /sdk/sem/msg (use sandbox::fs::ls)"},
			{contract.OpFsWrite, map[string]any{"path": "/sdk/sem/msg", "content": "x"}, contract.S212, "is a directory: /sdk/sem/msg"},
			{contract.OpFsWrite, map[string]any{"path": "/sdk/sem/msg/file/x", "content": "x"}, contract.S212, "not a directory: /sdk/sem/msg/file, or one of its parents, is a file"},
			{contract.OpFsMv, map[string]any{"src": "/sdk/sem/msg/file", "dst": "/sdk/sem/msg/file2"}, "", ""},
			{contract.OpFsMv, map[string]any{"src": "/sdk/sem/msg/file2", "dst": "/sdk/sem/msg/file2/in"}, contract.S212, "not a directory: /sdk/sem/msg/file2, or one of its parents, is a file"},
			{contract.OpFsMv, map[string]any{"src": "/sdk/sem/msg", "dst": "/sdk/sem/msg/in"}, contract.S210, "invalid sandbox::fs::mv request: cannot move /sdk/sem/msg into itself (/sdk/sem/msg/in)"},
			{contract.OpFsRm, map[string]any{"path": "/sdk/sem"}, contract.S214, "directory not empty: /sdk/sem (pass recursive: true)"},
			{contract.OpFsGrep, map[string]any{"path": "/sdk/sem/msg", "pattern": "a{2,1}"}, contract.S217, "invalid sandbox::fs::grep request: pattern \"a{2,1}\" is not a valid RE2 regular expression: error parsing regexp: invalid repeat count: `{2,1}`"},
		}
		for _, tc := range tests {
			if tc.code == "" {
				ss.call(tc.op, with(tc.payload), nil)
				continue
			}
			message(t, ss.fail(tc.op, with(tc.payload), tc.code), tc.want)
		}
	})
}
