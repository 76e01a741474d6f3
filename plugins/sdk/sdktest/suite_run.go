package sdktest

import (
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

func (s *suite) testRun(t *testing.T) {
	t.Run("shell code with files, env and stdin", func(t *testing.T) {
		ss := s.session(t)
		raw := ss.call(contract.OpRun, map[string]any{
			"image": s.target.Image,
			"lang":  "sh",
			"code":  "cat data.txt; printf ' %s ' \"$RUNVAR\"; cat",
			"files": []map[string]any{{"path": "data.txt", "content": "from a file"}},
			"env":   map[string]string{"RUNVAR": "from env"},
			"stdin": base64.StdEncoding.EncodeToString([]byte("from stdin")),
		}, nil)
		m := requireKeys(t, raw, "stdout", "stderr", "exit_code", "timed_out", "duration_ms", "success", "stdout_truncated", "stderr_truncated")
		if _, ok := m["sandbox_id"]; ok {
			t.Errorf("run without keep_sandbox must not return sandbox_id: %s", raw)
		}
		var out contract.RunResponse
		_ = json.Unmarshal(raw, &out)
		if out.Stdout != "from a file from env from stdin" || !out.Success {
			t.Errorf("run replied %s", raw)
		}
	})
	t.Run("a failing program is a reply", func(t *testing.T) {
		var out contract.RunResponse
		s.session(t).call(contract.OpRun, map[string]any{"image": s.target.Image, "lang": "shell", "code": "echo oops >&2; exit 4"}, &out)
		if out.ExitCode == nil || *out.ExitCode != 4 || out.Success || out.Stderr != "oops\n" {
			t.Errorf("want exit_code 4, success false, stderr \"oops\\n\"; got the reply %s", js(out))
		}
	})
	t.Run("keep_sandbox returns a live sandbox", func(t *testing.T) {
		ss := s.session(t)
		raw := ss.call(contract.OpRun, map[string]any{
			"image": s.target.Image, "lang": "bash", "code": "printf kept", "keep_sandbox": true,
			"files": []map[string]any{{"path": "/sdk-run/abs/file.txt", "content": "absolute"}},
		}, nil)
		var out contract.RunResponse
		_ = json.Unmarshal(raw, &out)
		if out.SandboxID == "" || out.Stdout != "kept" {
			t.Fatalf("run with keep_sandbox replied %s", raw)
		}
		t.Cleanup(func() { ss.stopQuietly(out.SandboxID) })
		s.expectFile(t, out.SandboxID, "/sdk-run/abs/file.txt", "absolute")
		if got := ss.sh(out.SandboxID, "printf alive", nil); got.Stdout != "alive" {
			t.Errorf("exec in the kept sandbox: %s", js(got))
		}
	})
	t.Run("an unknown lang is an interpreter path", func(t *testing.T) {
		var out contract.RunResponse
		s.session(t).call(contract.OpRun, map[string]any{"image": s.target.Image, "lang": "/bin/sh", "code": "printf literal-interpreter"}, &out)
		if out.Stdout != "literal-interpreter" {
			t.Errorf("run with lang /bin/sh: want stdout literal-interpreter, got the reply %s", js(out))
		}
	})
	t.Run("the sandbox is stopped after a run", func(t *testing.T) {
		ss := s.session(t)
		before := liveSandboxes(ss)
		ss.call(contract.OpRun, map[string]any{"image": s.target.Image, "lang": "sh", "code": "true"}, nil)
		waitFor(t, "the run's sandbox to stop", time.Minute, func() bool { return liveSandboxes(ss) == before })
	})
	t.Run("S100 in the create step is wrapped", func(t *testing.T) {
		e := s.session(t).fail(contract.OpRun, map[string]any{"image": deniedImage, "lang": "sh", "code": "true"}, contract.S100)
		checkRunFix(t, e, "create", contract.S100, false)
	})
	t.Run("S200 in the exec step is wrapped and the sandbox stopped", func(t *testing.T) {
		ss := s.session(t)
		e := ss.fail(contract.OpRun, map[string]any{"image": s.target.Image, "lang": "sh", "code": "sleep 60", "timeout_ms": 500}, contract.S200)
		id := checkRunFix(t, e, "exec", contract.S200, true)
		if id != "" {
			ss.fail(contract.OpExec, map[string]any{"sandbox_id": id, "cmd": "true"}, contract.S004)
		}
	})
	t.Run("S200 with keep_sandbox keeps the sandbox", func(t *testing.T) {
		ss := s.session(t)
		e := ss.fail(contract.OpRun, map[string]any{"image": s.target.Image, "lang": "sh", "code": "sleep 60", "timeout_ms": 500, "keep_sandbox": true}, contract.S200)
		id := checkRunFix(t, e, "exec", contract.S200, true)
		if id != "" {
			t.Cleanup(func() { ss.stopQuietly(id) })
			if got := ss.sh(id, "printf still-here", nil); got.Stdout != "still-here" {
				t.Errorf("exec in the kept sandbox: %s", js(got))
			}
		}
	})
	for _, tc := range []struct {
		name    string
		payload map[string]any
	}{
		{"S001 missing lang", map[string]any{"image": s.target.Image, "code": "true"}},
		{"S001 missing code", map[string]any{"image": s.target.Image, "lang": "sh"}},
		{"S001 files of the wrong shape", map[string]any{"image": s.target.Image, "lang": "sh", "code": "true", "files": []string{"a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.session(t).fail(contract.OpRun, tc.payload, contract.S001)
		})
	}
}

// checkRunFix checks run's step wrapping and returns fix.sandbox_id.
func checkRunFix(t *testing.T, e *contract.Error, step string, inner contract.Code, wantID bool) string {
	t.Helper()
	if e.Fix == nil {
		t.Fatalf("a failed run step must carry fix {context, sandbox_id, inner_code}; got none: %s", e.Message)
	}
	if e.Fix["context"] != "during sandbox::run step `"+step+"`" {
		t.Errorf("fix.context = %v, want the %s step", e.Fix["context"], step)
	}
	if e.Fix["inner_code"] != string(inner) {
		t.Errorf("fix.inner_code = %v, want %s", e.Fix["inner_code"], inner)
	}
	id, _ := e.Fix["sandbox_id"].(string)
	if wantID && id == "" {
		t.Errorf("fix.sandbox_id is empty after the sandbox was created")
	}
	if !wantID && id != "" {
		t.Errorf("fix.sandbox_id = %q before any sandbox existed", id)
	}
	return id
}

// liveSandboxes counts sandboxes list reports as not stopped.
func liveSandboxes(ss *session) int {
	var out contract.ListResponse
	ss.call(contract.OpList, nil, &out)
	n := 0
	for _, e := range out.Sandboxes {
		if !e.Stopped {
			n++
		}
	}
	return n
}
