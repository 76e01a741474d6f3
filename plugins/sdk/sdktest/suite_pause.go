package sdktest

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/contract"
)

// testPause checks sandbox::pause and sandbox::resume on an adapter that
// announces the pause capability in adapter::info; it is skipped for one
// that does not (the capability is optional).
func (s *suite) testPause(t *testing.T) {
	ss := s.session(t)
	var info contract.AdapterInfo
	ss.call(contract.OpAdapterInfo, map[string]any{}, &info)
	if !info.HasCapability(contract.CapabilityPause) {
		t.Skipf("the adapter does not announce the %q capability", contract.CapabilityPause)
	}
	status := func(ss *session, op, id, want string) {
		t := ss.t
		t.Helper()
		raw := ss.call(op, map[string]any{"sandbox_id": id}, nil)
		requireKeys(t, raw, "sandbox_id", "status")
		var st contract.SandboxStatus
		_ = json.Unmarshal(raw, &st)
		if st.SandboxID != id || st.Status != want {
			t.Errorf("%s replied %s, want sandbox_id %s and status %q", op, raw, id, want)
		}
	}
	listed := func(ss *session, id string) contract.ListEntry {
		t := ss.t
		t.Helper()
		var l contract.ListResponse
		ss.call(contract.OpList, nil, &l)
		for _, e := range l.Sandboxes {
			if e.SandboxID == id {
				return e
			}
		}
		t.Fatalf("sandbox %s missing from list", id)
		return contract.ListEntry{}
	}

	t.Run("pause keeps files, refuses exec and fs with S005, resume brings them back", func(t *testing.T) {
		ss := s.session(t)
		id := s.create(ss, nil)
		ss.call(contract.OpFsWrite, map[string]any{"sandbox_id": id, "path": "/tmp/sdktest-pause", "content": "kept"}, nil)
		status(ss, contract.OpPause, id, contract.SandboxPaused)
		if e := listed(ss, id); !e.Paused || e.Stopped {
			t.Errorf("a paused sandbox is listed as %s, want paused: true and stopped: false", js(e))
		}
		ss.fail(contract.OpExec, map[string]any{"sandbox_id": id, "cmd": "true"}, contract.S005)
		ss.fail(contract.OpFsStat, map[string]any{"sandbox_id": id, "path": "/tmp"}, contract.S005)
		// Pausing a paused sandbox changes nothing.
		status(ss, contract.OpPause, id, contract.SandboxPaused)
		status(ss, contract.OpResume, id, contract.SandboxRunning)
		status(ss, contract.OpResume, id, contract.SandboxRunning)
		if e := listed(ss, id); e.Paused {
			t.Errorf("a resumed sandbox is listed as %s, want paused: false", js(e))
		}
		var out contract.ExecResponse
		ss.call(contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"cat", "/tmp/sdktest-pause"}}, &out)
		if out.Stdout != "kept" || out.ExitCode == nil || *out.ExitCode != 0 {
			t.Errorf("after resume, cat of a file written before the pause: %s", js(out))
		}
		ss.call(contract.OpStop, map[string]any{"sandbox_id": id}, nil)
	})
	t.Run("a paused sandbox stops; then S004", func(t *testing.T) {
		ss := s.session(t)
		id := s.create(ss, nil)
		status(ss, contract.OpPause, id, contract.SandboxPaused)
		ss.call(contract.OpStop, map[string]any{"sandbox_id": id, "wait": true}, nil)
		ss.fail(contract.OpResume, map[string]any{"sandbox_id": id}, contract.S004)
		ss.fail(contract.OpPause, map[string]any{"sandbox_id": id}, contract.S004)
	})
	t.Run("S002 unknown sandbox", func(t *testing.T) {
		ss := s.session(t)
		ss.fail(contract.OpPause, map[string]any{"sandbox_id": uuid.NewString()}, contract.S002)
		ss.fail(contract.OpResume, map[string]any{"sandbox_id": uuid.NewString()}, contract.S002)
	})
	t.Run("S001 bad uuid", func(t *testing.T) {
		ss := s.session(t)
		ss.fail(contract.OpPause, map[string]any{"sandbox_id": "42"}, contract.S001)
	})
}
