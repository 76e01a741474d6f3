package state

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
)

func openStore(t *testing.T) *Store {
	t.Helper()
	root := t.TempDir()
	s, err := Open(filepath.Join(root, ".iii", "compose", "dev"), filepath.Join(root, "worker-compose.yaml"), "dev")
	assert.NilError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// The project token: made once (64 hex digits, one line, 0600), reused
// afterwards, kept owner-only, replaced on demand; a file that does not
// hold a token is replaced rather than sent.
func TestProjectToken(t *testing.T) {
	s := openStore(t)
	tok, created, err := s.ProjectToken()
	assert.NilError(t, err)
	assert.Check(t, created)
	assert.Check(t, is.Len(tok, 64))
	data, err := os.ReadFile(s.ProjectTokenPath())
	assert.NilError(t, err)
	assert.Equal(t, string(data), tok+"\n")
	st, err := os.Stat(s.ProjectTokenPath())
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	dir, err := os.Stat(s.Dir())
	assert.NilError(t, err)
	assert.Equal(t, dir.Mode().Perm(), os.FileMode(0o700))

	again, created, err := s.ProjectToken()
	assert.NilError(t, err)
	assert.Check(t, !created)
	assert.Equal(t, again, tok)

	// Loosened by someone: tightened again on the next read.
	assert.NilError(t, os.Chmod(s.ProjectTokenPath(), 0o644))
	_, _, err = s.ProjectToken()
	assert.NilError(t, err)
	st, _ = os.Stat(s.ProjectTokenPath())
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	repl, err := s.ReplaceProjectToken()
	assert.NilError(t, err)
	assert.Check(t, repl != tok)
	got, created, err := s.ProjectToken()
	assert.NilError(t, err)
	assert.Check(t, !created)
	assert.Equal(t, got, repl)

	assert.NilError(t, os.WriteFile(s.ProjectTokenPath(), []byte("not a token\n"), 0o600))
	fresh, created, err := s.ProjectToken()
	assert.NilError(t, err)
	assert.Check(t, created)
	assert.Check(t, fresh != repl)
}

func TestParseProjectToken(t *testing.T) {
	good := strings.Repeat("0123456789abcdef", 4)
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"with newline", good + "\n", true},
		{"without newline", good, true},
		{"upper case", strings.ToUpper(good), false},
		{"short", good[:63], false},
		{"long", good + "0", false},
		{"two newlines", good + "\n\n", false},
		{"space", " " + good[1:], false},
		{"empty", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProjectToken([]byte(tc.in))
			if !tc.ok {
				assert.Check(t, err != nil)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, good)
		})
	}
}

func FuzzParseProjectToken(f *testing.F) {
	f.Add([]byte(strings.Repeat("ab", 32) + "\n"))
	f.Add([]byte("zz"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := ParseProjectToken(data)
		if err == nil && len(tok) != 64 {
			t.Fatalf("accepted a token of %d characters", len(tok))
		}
	})
}

// vm-workers.json: a run is recorded once per VM, adapter version and
// exposure; records can be dropped by predicate; the file is owner-only.
func TestVMRuns(t *testing.T) {
	s := openStore(t)
	r, err := s.LoadVMRuns()
	assert.NilError(t, err)
	assert.Check(t, is.Len(r.Runs, 0))

	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	old := VMRun{Container: "api", VMID: "shop-1-dev-api", Adapter: "sandbox-libkrun", AdapterVersion: "0.2.9", HostDir: "/p", HoldsComposeFile: true, At: at}
	assert.NilError(t, s.RecordVMRun(old))
	assert.NilError(t, s.RecordVMRun(old)) // the same run again: one record
	newer := old
	newer.AdapterVersion = "0.3.1"
	assert.NilError(t, s.RecordVMRun(newer))
	r, err = s.LoadVMRuns()
	assert.NilError(t, err)
	assert.DeepEqual(t, r.Runs, []VMRun{old, newer})
	st, err := os.Stat(s.VMRunsPath())
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	n, err := s.DropVMRuns(func(v VMRun) bool { return v.AdapterVersion == "0.2.9" })
	assert.NilError(t, err)
	assert.Equal(t, n, 1)
	r, err = s.LoadVMRuns()
	assert.NilError(t, err)
	assert.DeepEqual(t, r.Runs, []VMRun{newer})
	n, err = s.DropVMRuns(func(VMRun) bool { return false })
	assert.NilError(t, err)
	assert.Equal(t, n, 0)
}

func TestDecodeVMRunsRejects(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"not json", "{", "not a Compose vm-workers file"},
		{"unknown field", `{"version":1,"runs":[],"x":1}`, "not a Compose vm-workers file"},
		{"trailing", `{"version":1,"runs":[]} {}`, "trailing data"},
		{"version", `{"version":2,"runs":[]}`, "version 2 is not supported"},
		{"no vm_id", `{"version":1,"runs":[{"adapter":"a"}]}`, "record 0 has no vm_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeVMRuns([]byte(tc.in), "/s/vm-workers.json")
			assert.Check(t, is.Equal(compose.CodeOf(err), compose.CodeInvalidStateFile))
			assert.Check(t, is.ErrorContains(err, tc.want))
			assert.Check(t, is.ErrorContains(err, "replace the project token"))
		})
	}
}

func FuzzDecodeVMRuns(f *testing.F) {
	f.Add([]byte(`{"version":1,"runs":[{"container":"a","vm_id":"x","adapter":"sandbox-libkrun","adapter_version":"0.2.9","host_dir":"/p","holds_compose_file":true,"at":"2026-01-02T03:04:05Z"}]}`))
	f.Add([]byte(`{"version":1,"runs":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeVMRuns(data, "vm-workers.json")
		if err != nil {
			return
		}
		for _, run := range r.Runs {
			if run.VMID == "" || run.Adapter == "" {
				t.Fatal("accepted a record without vm_id or adapter")
			}
		}
	})
}

// LocationSlug follows the project's state: the same as Slug without
// III_COMPOSE_STATE_DIR, and different for each state directory.
func TestLocationSlug(t *testing.T) {
	p := "/p/shop/worker-compose.yaml"
	none := func(string) string { return "" }
	assert.Equal(t, LocationSlug(p, none), Slug(p))
	in := func(d string) func(string) string {
		return func(k string) string {
			if k == EnvStateDir {
				return d
			}
			return ""
		}
	}
	a, b := LocationSlug(p, in("/var/a")), LocationSlug(p, in("/var/b"))
	assert.Check(t, strings.HasPrefix(a, "shop-"))
	assert.Check(t, a != b && a != Slug(p))
	assert.Equal(t, LocationSlug(p, in("/var/a/")), a)
	assert.Check(t, LocationSlug("/q/shop/worker-compose.yaml", none) != Slug(p), "a moved project gets another slug")
}
