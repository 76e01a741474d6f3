package sdktest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

func (s *suite) testFs(t *testing.T) {
	ss := s.session(t)
	id := s.create(ss, nil)
	with := func(payload map[string]any) map[string]any {
		return Merge(map[string]any{"sandbox_id": id}, payload)
	}

	t.Run("write and read text", func(t *testing.T) {
		ss := s.session(t)
		var w contract.FsWriteResponse
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/text.txt", "content": "héllo\nworld\n", "parents": true}), &w)
		if w.BytesWritten != uint64(len("héllo\nworld\n")) || w.Path != "/sdk/text.txt" {
			t.Errorf("write replied %s", js(w))
		}
		raw := ss.call(contract.OpFsRead, with(map[string]any{"path": "/sdk/text.txt"}), nil)
		requireKeys(t, raw, "content", "body", "size", "mode", "mtime")
		var r contract.FsReadResponse
		_ = json.Unmarshal(raw, &r)
		if r.Body == nil || *r.Body != "héllo\nworld\n" || r.Size != w.BytesWritten || r.Mode != 0o644 || r.Mtime == 0 {
			t.Errorf("read replied %s", raw)
		}
		s.readChannel(t, r.Content, []byte("héllo\nworld\n"))
	})
	t.Run("write and read binary with content_b64", func(t *testing.T) {
		ss := s.session(t)
		data := []byte{0, 1, 2, 0xff, 0xfe, '\n'}
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/bin.dat", "content_b64": base64.StdEncoding.EncodeToString(data), "mode": "0600"}), nil)
		raw := ss.call(contract.OpFsRead, with(map[string]any{"path": "/sdk/bin.dat"}), nil)
		m := keys(t, raw)
		if _, ok := m["body"]; ok {
			t.Errorf("a file that is not UTF-8 has a body: %s", raw)
		}
		var r contract.FsReadResponse
		_ = json.Unmarshal(raw, &r)
		if r.Size != uint64(len(data)) || r.Mode != 0o600 {
			t.Errorf("read replied %s", raw)
		}
		s.readChannel(t, r.Content, data)
	})
	t.Run("write and read 3 MiB through channels", func(t *testing.T) {
		ch, ok := s.c.(Channels)
		if !ok {
			t.Skip("the Caller does not implement sdktest.Channels")
		}
		ss := s.session(t)
		data := bytes.Repeat([]byte("0123456789abcdef"), 3<<16)
		ref, err := ch.WriteChannel(context.Background(), data)
		if err != nil {
			t.Fatal(err)
		}
		var w contract.FsWriteResponse
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/big.txt", "content": ref}), &w)
		if w.BytesWritten != uint64(len(data)) {
			t.Errorf("wrote %d bytes, want %d", w.BytesWritten, len(data))
		}
		raw := ss.call(contract.OpFsRead, with(map[string]any{"path": "/sdk/big.txt"}), nil)
		if _, ok := keys(t, raw)["body"]; ok {
			t.Errorf("fs::read of a file of 1 MiB or more: want content as a channel and no body, got a body in the reply %s", truncate(string(raw), 300))
		}
		var r contract.FsReadResponse
		_ = json.Unmarshal(raw, &r)
		s.readChannel(t, r.Content, data)
	})
	t.Run("stat and ls", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/ls/sub", "parents": true}), nil)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/ls/b.txt", "content": "bb", "mode": "0640"}), nil)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/ls/a.txt", "content": "a"}), nil)
		raw := ss.call(contract.OpFsStat, with(map[string]any{"path": "/sdk/ls/b.txt"}), nil)
		requireKeys(t, raw, "name", "is_dir", "size", "mode", "mtime", "is_symlink")
		var st contract.FsEntry
		_ = json.Unmarshal(raw, &st)
		if st.Name != "b.txt" || st.IsDir || st.Size != 2 || st.Mode != 0o640 || st.IsSymlink || st.Mtime == 0 {
			t.Errorf("stat replied %s", raw)
		}
		if !strings.Contains(string(raw), `"mode":"0640"`) {
			t.Errorf("mode must be an octal string: %s", raw)
		}
		var ls contract.FsLsResponse
		ss.call(contract.OpFsLs, with(map[string]any{"path": "/sdk/ls"}), &ls)
		var names []string
		for _, e := range ls.Entries {
			names = append(names, e.Name)
		}
		if strings.Join(names, ",") != "a.txt,b.txt,sub" || !ls.Entries[2].IsDir {
			t.Errorf("ls replied %s", js(ls.Entries))
		}
	})
	t.Run("mkdir", func(t *testing.T) {
		ss := s.session(t)
		var out contract.FsMkdirResponse
		ss.call(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/mk", "mode": "0700"}), &out)
		if !out.Created {
			t.Errorf("mkdir replied %s", js(out))
		}
		var st contract.FsEntry
		ss.call(contract.OpFsStat, with(map[string]any{"path": "/sdk/mk"}), &st)
		if !st.IsDir || st.Mode != 0o700 {
			t.Errorf("stat of a new directory: %s", js(st))
		}
		raw := ss.call(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/mk", "parents": true}), &out)
		if out.Created {
			t.Errorf("mkdir with parents of an existing directory: want created: false, got the reply %s", truncate(string(raw), 300))
		}
	})
	t.Run("chmod", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/ch/x/f1", "content": "1", "parents": true}), nil)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/ch/f2", "content": "2"}), nil)
		var out contract.FsChmodResponse
		ss.call(contract.OpFsChmod, with(map[string]any{"path": "/sdk/ch/f2", "mode": "0600"}), &out)
		if out.Updated != 1 {
			t.Errorf("chmod of one file updated %d", out.Updated)
		}
		ss.call(contract.OpFsChmod, with(map[string]any{"path": "/sdk/ch", "mode": "0755", "recursive": true}), &out)
		if out.Updated != 4 {
			t.Errorf("recursive chmod of 2 directories and 2 files updated %d", out.Updated)
		}
		var st contract.FsEntry
		ss.call(contract.OpFsStat, with(map[string]any{"path": "/sdk/ch/x/f1"}), &st)
		if st.Mode != 0o755 {
			t.Errorf("mode after chmod: %s", st.Mode)
		}
		ss.fail(contract.OpFsChmod, with(map[string]any{"path": "/sdk/ch"}), contract.S210)
	})
	t.Run("mv and rm", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/mv/a", "content": "A", "parents": true}), nil)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/mv/b", "content": "B"}), nil)
		ss.fail(contract.OpFsMv, with(map[string]any{"src": "/sdk/mv/a", "dst": "/sdk/mv/b"}), contract.S213)
		var mv contract.FsMvResponse
		ss.call(contract.OpFsMv, with(map[string]any{"src": "/sdk/mv/a", "dst": "/sdk/mv/b", "overwrite": true}), &mv)
		if !mv.Moved {
			t.Errorf("mv replied %s", js(mv))
		}
		var r contract.FsReadResponse
		ss.call(contract.OpFsRead, with(map[string]any{"path": "/sdk/mv/b"}), &r)
		if r.Body == nil || *r.Body != "A" {
			t.Errorf("after mv with overwrite the destination holds %v", r.Body)
		}
		ss.fail(contract.OpFsStat, with(map[string]any{"path": "/sdk/mv/a"}), contract.S211)
		ss.fail(contract.OpFsRm, with(map[string]any{"path": "/sdk/mv"}), contract.S214)
		var rm contract.FsRmResponse
		ss.call(contract.OpFsRm, with(map[string]any{"path": "/sdk/mv", "recursive": true}), &rm)
		if !rm.Removed {
			t.Errorf("rm replied %s", js(rm))
		}
		ss.fail(contract.OpFsStat, with(map[string]any{"path": "/sdk/mv"}), contract.S211)
	})
	t.Run("grep", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/g/a.go", "content": "package a\n// TODO one\nfunc A() {}\n// todo two\n", "parents": true}), nil)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/g/sub/b.txt", "content": "TODO three " + strings.Repeat("x", 100) + "\n", "parents": true}), nil)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/g/skip/c.go", "content": "TODO skipped\n", "parents": true}), nil)

		var out contract.FsGrepResponse
		raw := ss.call(contract.OpFsGrep, with(map[string]any{"path": "/sdk/g", "pattern": "TODO \\w+", "exclude_glob": []string{"skip/"}}), &out)
		requireKeys(t, raw, "matches", "truncated")
		got := grepSummary(out)
		if got != "/sdk/g/a.go:2:// TODO one|/sdk/g/sub/b.txt:1:TODO three "+strings.Repeat("x", 100) || out.Truncated {
			t.Errorf("grep: %s", got)
		}
		ss.call(contract.OpFsGrep, with(map[string]any{"path": "/sdk/g", "pattern": "todo", "ignore_case": true, "include_glob": []string{"*.go"}, "exclude_glob": []string{"skip/"}}), &out)
		if grepSummary(out) != "/sdk/g/a.go:2:// TODO one|/sdk/g/a.go:4:// todo two" {
			t.Errorf("grep with ignore_case and include_glob: %s", grepSummary(out))
		}
		ss.call(contract.OpFsGrep, with(map[string]any{"path": "/sdk/g", "pattern": "TODO", "max_matches": 1, "max_line_bytes": 8}), &out)
		if len(out.Matches) != 1 || !out.Truncated || out.Matches[0].Content != "// TODO …" {
			t.Errorf("grep with max_matches 1 and max_line_bytes 8: %+v truncated=%v", out.Matches, out.Truncated)
		}
		ss.call(contract.OpFsGrep, with(map[string]any{"path": "/sdk/g", "pattern": "TODO", "recursive": false}), &out)
		if grepSummary(out) != "/sdk/g/a.go:2:// TODO one" {
			t.Errorf("grep without recursion: %s", grepSummary(out))
		}
		ss.fail(contract.OpFsGrep, with(map[string]any{"path": "/sdk/g", "pattern": "("}), contract.S217)
		ss.fail(contract.OpFsGrep, with(map[string]any{"path": "/sdk/nothing-here", "pattern": "x"}), contract.S211)
	})
	t.Run("sed", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/s/one.txt", "content": "foo bar foo\nfoo\n", "parents": true, "mode": "0640"}), nil)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/s/two.txt", "content": "nothing\n"}), nil)
		var out contract.FsSedResponse
		raw := ss.call(contract.OpFsSed, with(map[string]any{"path": "/sdk/s", "pattern": "f(o+)", "replacement": "b${1}m"}), &out)
		requireKeys(t, raw, "results", "total_replacements")
		if out.TotalReplacements != 3 || len(out.Results) != 1 || out.Results[0].Path != "/sdk/s/one.txt" || !out.Results[0].Success {
			t.Errorf("sed over a directory: %s", raw)
		}
		s.expectFile(t, id, "/sdk/s/one.txt", "boom bar boom\nboom\n")
		var st contract.FsEntry
		ss.call(contract.OpFsStat, with(map[string]any{"path": "/sdk/s/one.txt"}), &st)
		if st.Mode != 0o640 {
			t.Errorf("sed changed the file's mode to %s", st.Mode)
		}

		ss.call(contract.OpFsSed, with(map[string]any{"files": []string{"/sdk/s/one.txt", "/sdk/s/missing.txt"}, "pattern": "o.", "replacement": "$1", "regex": false, "first_only": true}), &out)
		if out.TotalReplacements != 0 || len(out.Results) != 2 || !out.Results[0].Success || out.Results[1].Success || out.Results[1].Error == "" {
			t.Errorf("sed over files with a literal pattern that does not occur: %s", js(out))
		}
		ss.call(contract.OpFsSed, with(map[string]any{"files": []string{"/sdk/s/one.txt"}, "pattern": "BOOM", "replacement": "$x", "regex": false, "ignore_case": true, "first_only": true}), &out)
		if out.TotalReplacements != 1 {
			t.Errorf("sed first_only replaced %d", out.TotalReplacements)
		}
		s.expectFile(t, id, "/sdk/s/one.txt", "$x bar boom\nboom\n")

		ss.fail(contract.OpFsSed, with(map[string]any{"path": "/sdk/s", "files": []string{"/sdk/s/one.txt"}, "pattern": "a", "replacement": "b"}), contract.S210)
		ss.fail(contract.OpFsSed, with(map[string]any{"pattern": "a", "replacement": "b"}), contract.S210)
		ss.fail(contract.OpFsSed, with(map[string]any{"path": "/sdk/s", "pattern": "[", "replacement": "b"}), contract.S217)
	})

	t.Run("S210 invalid requests", func(t *testing.T) {
		ss := s.session(t)
		ss.fail(contract.OpFsWrite, with(map[string]any{"path": "/sdk/x", "content": "a", "content_b64": "YQ=="}), contract.S210)
		ss.fail(contract.OpFsWrite, with(map[string]any{"path": "/sdk/x"}), contract.S210)
		ss.fail(contract.OpFsStat, with(map[string]any{}), contract.S210)
		ss.fail(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/x", "mode": 755}), contract.S210)
		ss.fail(contract.OpFsStat, map[string]any{"sandbox_id": "nope", "path": "/"}, contract.S001)
	})
	t.Run("S211 parent missing carries a fix that works", func(t *testing.T) {
		ss := s.session(t)
		req := with(map[string]any{"path": "/sdk/deep/er/file.txt", "content": "deep"})
		e := ss.fail(contract.OpFsWrite, req, contract.S211)
		if e.Fix == nil || e.Fix["parents"] != true {
			t.Fatalf("S211 for a missing parent must carry fix {parents: true}, got %v", e.Fix)
		}
		merged := maps.Clone(req)
		maps.Copy(merged, e.Fix)
		ss.call(contract.OpFsWrite, merged, nil)
		s.expectFile(t, id, "/sdk/deep/er/file.txt", "deep")

		e = ss.fail(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/deeper/a/b"}), contract.S211)
		if e.Fix == nil || e.Fix["parents"] != true {
			t.Errorf("mkdir S211 fix: %v", e.Fix)
		}
		e = ss.fail(contract.OpFsStat, with(map[string]any{"path": "/sdk/no-such-file"}), contract.S211)
		if e.Fix != nil {
			t.Errorf("S211 for a missing path has no fix, got %v", e.Fix)
		}
	})
	t.Run("S212 wrong type", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/t/file", "content": "f", "parents": true}), nil)
		ss.fail(contract.OpFsLs, with(map[string]any{"path": "/sdk/t/file"}), contract.S212)
		ss.fail(contract.OpFsRead, with(map[string]any{"path": "/sdk/t"}), contract.S212)
		ss.fail(contract.OpFsWrite, with(map[string]any{"path": "/sdk/t", "content": "x"}), contract.S212)
		ss.fail(contract.OpFsWrite, with(map[string]any{"path": "/sdk/t/file/below", "content": "x"}), contract.S212)
	})
	t.Run("S213 already exists", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/exists", "parents": true}), nil)
		ss.fail(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/exists"}), contract.S213)
	})
	t.Run("S214 not empty", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsWrite, with(map[string]any{"path": "/sdk/full/f", "content": "f", "parents": true}), nil)
		ss.fail(contract.OpFsRm, with(map[string]any{"path": "/sdk/full"}), contract.S214)
	})
	t.Run("S215 permission denied", func(t *testing.T) {
		ss := s.session(t)
		var denied string
		if s.target.DenyPath != nil {
			denied = s.target.DenyPath(context.Background(), t, s.c, id)
		} else {
			ss.call(contract.OpFsMkdir, with(map[string]any{"path": "/sdk/ro", "parents": true}), nil)
			ss.call(contract.OpFsChmod, with(map[string]any{"path": "/sdk/ro", "mode": "0555"}), nil)
			denied = "/sdk/ro/file"
		}
		raw, err := ss.raw(contract.OpFsWrite, with(map[string]any{"path": denied, "content": "x"}))
		if err == nil && s.target.DenyPath == nil {
			t.Skip("writing into a 0555 directory succeeded: the adapter acts as root; set Target.DenyPath to test S215")
		}
		var se *contract.Error
		if !errors.As(err, &se) || se.Code != contract.S215 {
			t.Fatalf("writing %s: want S215, got %s", denied, observed(raw, err))
		}
		checkWireError(t, se)
	})
	t.Run("S216 other I/O errors", func(t *testing.T) {
		// A name longer than any filesystem allows (255 bytes).
		s.session(t).fail(contract.OpFsWrite, with(map[string]any{"path": "/sdk/" + strings.Repeat("n", 300), "content": "x"}), contract.S216)
	})
	t.Run("S217 invalid regex", func(t *testing.T) {
		s.session(t).fail(contract.OpFsGrep, with(map[string]any{"path": "/", "pattern": "a{2,1}"}), contract.S217)
	})
	t.Run("S002 unknown sandbox", func(t *testing.T) {
		s.session(t).fail(contract.OpFsLs, map[string]any{"sandbox_id": "00000000-0000-4000-8000-000000000000", "path": "/"}, contract.S002)
	})
}

func grepSummary(out contract.FsGrepResponse) string {
	var parts []string
	for _, m := range out.Matches {
		parts = append(parts, m.Path+":"+itoa(m.Line)+":"+m.Content)
	}
	return strings.Join(parts, "|")
}

func itoa(n uint64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// expectFile checks a file's contents through fs::read's body.
func (s *suite) expectFile(t *testing.T, id, path, want string) {
	t.Helper()
	var r contract.FsReadResponse
	s.session(t).call(contract.OpFsRead, map[string]any{"sandbox_id": id, "path": path}, &r)
	if r.Body == nil || *r.Body != want {
		got := "(no body)"
		if r.Body != nil {
			got = *r.Body
		}
		t.Errorf("%s holds %q, want %q", path, got, want)
	}
}

// readChannel checks the bytes behind fs::read's content, when the Caller
// can read channels.
func (s *suite) readChannel(t *testing.T, ref protocol.StreamChannelRef, want []byte) {
	t.Helper()
	if ref.ChannelID == "" || ref.AccessKey == "" || ref.Direction != protocol.DirectionRead {
		t.Errorf("fs::read content is not the read end of a channel: %+v", ref)
		return
	}
	ch, ok := s.c.(Channels)
	if !ok {
		return
	}
	got, err := ch.ReadChannel(context.Background(), ref)
	if err != nil {
		t.Errorf("read the fs::read channel: %v", err)
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the fs::read channel carried %d bytes, want %d (equal: false)", len(got), len(want))
	}
}
