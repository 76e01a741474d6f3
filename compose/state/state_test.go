package state

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestSlug(t *testing.T) {
	tests := []struct{ path, prefix string }{
		{"/home/me/shop/worker-compose.yaml", "shop-"},
		{"/home/me/my shop.v2/worker-compose.yaml", "my-shop-v2-"},
		{"/worker-compose.yaml", "project-"},
		{"/srv/été/worker-compose.yaml", "-t--"},
	}
	for _, tc := range tests {
		s := Slug(tc.path)
		assert.Check(t, is.Equal(s[:len(s)-8], tc.prefix), tc.path)
		assert.Check(t, is.Len(s, len(tc.prefix)+8))
	}
	assert.Assert(t, Slug("/a/shop/worker-compose.yaml") != Slug("/b/shop/worker-compose.yaml"))
}

func TestDirFor(t *testing.T) {
	none := func(string) string { return "" }
	assert.Equal(t, DirFor("/p/shop/worker-compose.yaml", "dev", none), "/p/shop/.iii/compose/dev")
	env := func(k string) string {
		if k == EnvStateDir {
			return "/var/lib/iii"
		}
		return ""
	}
	assert.Equal(t, DirFor("/p/shop/worker-compose.yaml", "dev", env),
		filepath.Join("/var/lib/iii", Slug("/p/shop/worker-compose.yaml"), "dev"))
}

// A known slug, computed independently: sha256("/srv/shop/worker-compose.yaml").
func TestSlugHash(t *testing.T) {
	out, err := exec.Command("sh", "-c", "printf %s /srv/shop/worker-compose.yaml | sha256sum").Output()
	if err != nil {
		t.Skip("sha256sum not available")
	}
	assert.Equal(t, Slug("/srv/shop/worker-compose.yaml"), "shop-"+string(out[:8]))
}

func TestOpenLocksAndLayout(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, ".iii", "compose", "dev")
	compose1 := filepath.Join(root, "worker-compose.yaml")
	s, err := Open(dir, compose1, "dev")
	assert.NilError(t, err)
	for _, d := range []string{dir, s.ConfigDir(), s.LogsDir()} {
		st, err := os.Stat(d)
		assert.NilError(t, err)
		assert.Check(t, is.Equal(st.Mode().Perm(), os.FileMode(0o700)), d)
	}

	// The same project and namespace cannot be opened twice.
	_, err = Open(dir, compose1, "dev")
	assert.Equal(t, compose.CodeOf(err), compose.CodeStateDirUnavailable)
	assert.ErrorContains(t, err, "already run by another Compose (pid ")

	// state.json: owner-only, round trip.
	st := NewState(compose1)
	now := time.Now().UTC().Truncate(time.Second)
	st.Containers["api"] = &Record{PID: 1234, Birth: "99", Status: StatusReady, StartedAt: &now}
	assert.NilError(t, s.Save(st))
	info, err := os.Stat(s.StatePath())
	assert.NilError(t, err)
	assert.Equal(t, info.Mode().Perm(), os.FileMode(0o600))
	back, err := s.Load()
	assert.NilError(t, err)
	assert.DeepEqual(t, back, st)

	s.Close()

	// Another compose file cannot take over the directory.
	s2, err := Open(dir, filepath.Join(root, "other.yaml"), "dev")
	assert.Equal(t, compose.CodeOf(err), compose.CodeStateDirUnavailable)
	assert.ErrorContains(t, err, "two compose files in one directory need different namespaces")
	assert.Check(t, s2 == nil)

	s3, err := Open(dir, compose1, "dev")
	assert.NilError(t, err)
	defer s3.Close()
	assert.NilError(t, s3.Clear())
	got, err := s3.Load()
	assert.NilError(t, err)
	assert.Check(t, got == nil)

	p, err := s3.WriteEngineConfig([]byte("workers: []\n"))
	assert.NilError(t, err)
	info, err = os.Stat(p)
	assert.NilError(t, err)
	assert.Equal(t, info.Mode().Perm(), os.FileMode(0o600))
	s3.RemoveEngineConfig()
	_, err = os.Stat(p)
	assert.Check(t, os.IsNotExist(err))
}

// The engine lock refuses a second managed start of the same project and
// namespace with DAEMON_NAMESPACE_TAKEN, naming the holder; it is free
// again once released.
func TestEngineLockRefusesSecondOwner(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a")
	a, err := LockEngine(dir, "/x/worker-compose.yaml", "dev")
	assert.NilError(t, err)
	_, err = LockEngine(dir, "/x/worker-compose.yaml", "dev")
	assert.Equal(t, compose.CodeOf(err), compose.CodeDaemonNamespaceTaken)
	assert.ErrorContains(t, err, fmt.Sprintf("(pid %d) already runs the engine of /x/worker-compose.yaml in namespace \"dev\"", os.Getpid()))
	a.Release()
	b, err := LockEngine(dir, "/x/worker-compose.yaml", "dev")
	assert.NilError(t, err)
	b.Release()
	b.Release()
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct{ name, data, msg string }{
		{"not json", "{", "not a Compose state file"},
		{"unknown field", `{"version":1,"compose_path":"/x","containers":{},"extra":1}`, "unknown field"},
		{"version", `{"version":2,"compose_path":"/x","containers":{}}`, "version 2 is not supported"},
		{"no path", `{"version":1,"containers":{}}`, "compose_path is missing"},
		{"bad status", `{"version":1,"compose_path":"/x","containers":{"a":{"status":"weird"}}}`, `status "weird"`},
		{"init pid", `{"version":1,"compose_path":"/x","containers":{"a":{"status":"ready","pid":1}}}`, "pid 1"},
		{"null record", `{"version":1,"compose_path":"/x","containers":{"a":null}}`, "no record"},
		{"trailing", `{"version":1,"compose_path":"/x","containers":{}} {}`, "trailing data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.data), "/s/state.json")
			assert.Equal(t, compose.CodeOf(err), compose.CodeInvalidStateFile)
			assert.ErrorContains(t, err, tc.msg)
			assert.ErrorContains(t, err, "/s/state.json: ")
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"version":1,"compose_path":"/x","containers":{"a":{"pid":5,"birth":"9","status":"ready"}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := Decode(data, "state.json")
		if err != nil {
			if compose.CodeOf(err) != compose.CodeInvalidStateFile {
				t.Fatalf("error without the code: %v", err)
			}
			return
		}
		enc, err := st.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(enc, "state.json"); err != nil {
			t.Fatalf("re-decoding an encoded state failed: %v", err)
		}
	})
}

// After a crash each running record is checked: the same process is
// adopted, a dead one (or a reused pid) fails, an unverifiable one is left
// alone and reported. Records that were not running are untouched.
func TestRecover(t *testing.T) {
	st := NewState("/x/worker-compose.yaml")
	st.Containers = map[string]*Record{
		"alive":   {PID: 100, Birth: "1", Status: StatusReady},
		"dead":    {PID: 101, Birth: "1", Status: StatusReady},
		"unknown": {PID: 102, Status: StatusStarting},
		"stopped": {Status: StatusStopped},
		"failed":  {PID: 104, Status: StatusFailed},
	}
	check := func(pid int, birth string) proc.Match {
		switch pid {
		case 100:
			return proc.Same
		case 102:
			return proc.Unverifiable
		}
		return proc.Gone
	}
	got := Recover(st, check)
	assert.Equal(t, len(got), 3)
	assert.Equal(t, got[0].Container, "alive")
	assert.Equal(t, got[0].Outcome, Adopted)
	assert.Equal(t, got[1].Container, "dead")
	assert.Equal(t, got[1].Outcome, Dead)
	assert.Equal(t, got[1].Record.PID, 101)
	assert.Equal(t, got[2].Outcome, Unverified)
	assert.Equal(t, st.Containers["dead"].Status, StatusFailed)
	assert.Equal(t, st.Containers["dead"].PID, 0)
	assert.Equal(t, st.Containers["dead"].LastError.Code, CodeWorkerLost)
	assert.Equal(t, st.Containers["alive"].Status, StatusReady)
	assert.Equal(t, st.Containers["failed"].PID, 104)
}

// Recovery against real processes: a live process recorded with its birth
// is adopted; the same pid with another birth is a reused pid.
func TestRecoverRealProcesses(t *testing.T) {
	cmd := exec.Command("sleep", "300")
	assert.NilError(t, cmd.Start())
	defer func() {
		_ = cmd.Process.Kill()
		waitfor.Func(t, waitfor.Default, "the killed sleep to be reaped", func() { _ = cmd.Wait() })
	}()
	birth, err := proc.Birth(cmd.Process.Pid)
	assert.NilError(t, err)
	dead := exec.Command("true")
	assert.NilError(t, dead.Run())

	st := NewState("/x/worker-compose.yaml")
	st.Containers = map[string]*Record{
		"same":   {PID: cmd.Process.Pid, Birth: birth, Status: StatusReady},
		"reused": {PID: cmd.Process.Pid, Birth: birth + "0", Status: StatusReady},
		"gone":   {PID: dead.Process.Pid, Birth: "1", Status: StatusReady},
	}
	out := map[string]Outcome{}
	for _, r := range Recover(st, proc.Check) {
		out[r.Container] = r.Outcome
	}
	assert.DeepEqual(t, out, map[string]Outcome{"same": Adopted, "reused": Dead, "gone": Dead})
}
