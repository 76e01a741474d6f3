package sdktest

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/iii-sandbox/iii/contract"
)

func (s *suite) testInfo(t *testing.T) {
	ss := s.session(t)
	raw := ss.call(contract.OpAdapterInfo, map[string]any{}, nil)
	requireKeys(t, raw, "adapter", "adapter_version", "contract")
	var info contract.AdapterInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		t.Fatal(err)
	}
	if info.Adapter == "" || info.AdapterVersion == "" {
		t.Errorf("adapter and adapter_version must be set: %s", raw)
	}
	if info.Contract.Major != contract.Major {
		t.Errorf("contract major %d, want %d", info.Contract.Major, contract.Major)
	}
}

func (s *suite) testCatalog(t *testing.T) {
	ss := s.session(t)
	raw := ss.call(contract.OpCatalogList, map[string]any{}, nil)
	requireKeys(t, raw, "images")
	var out contract.CatalogListResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	var names, customs []string
	seenCustom := false
	for _, img := range out.Images {
		names = append(names, img.Name)
		switch img.Kind {
		case contract.KindPreset:
			if seenCustom {
				t.Errorf("preset %q listed after a custom image: presets come first", img.Name)
			}
		case contract.KindCustom:
			seenCustom = true
			customs = append(customs, img.Name)
		default:
			t.Errorf("image %q has kind %q, want preset or custom", img.Name, img.Kind)
		}
		if img.OCIRef == "" {
			t.Errorf("image %q has no oci_ref", img.Name)
		}
	}
	if !slices.Contains(names, s.target.Image) {
		t.Errorf("the catalog %v lacks the target image %q", names, s.target.Image)
	}
	if !slices.IsSorted(customs) {
		t.Errorf("custom images %v are not sorted by name", customs)
	}
	i := slices.IndexFunc(out.Images, func(c contract.CatalogImage) bool { return c.Name == deniedImage })
	if i < 0 || out.Images[i].Kind != contract.KindCustom || out.Images[i].OCIRef != "registry.invalid/sdktest/denied:1" {
		t.Errorf("custom_images entry %q missing or wrong in %s", deniedImage, raw)
	}
}

func (s *suite) testCreate(t *testing.T) {
	t.Run("returns a uuid v4 and the image", func(t *testing.T) {
		ss := s.session(t)
		raw := ss.call(contract.OpCreate, map[string]any{"image": s.target.Image, "name": "sdktest-create"}, nil)
		m := requireKeys(t, raw, "sandbox_id", "image")
		var out contract.CreateResponse
		_ = json.Unmarshal(raw, &out)
		t.Cleanup(func() { ss.stopQuietly(out.SandboxID) })
		id, err := uuid.Parse(out.SandboxID)
		if err != nil || id.Version() != 4 || id.String() != out.SandboxID {
			t.Errorf("sandbox_id %q is not a canonical UUID v4", out.SandboxID)
		}
		if string(m["image"]) != `"`+s.target.Image+`"` {
			t.Errorf("image %s, want %q", m["image"], s.target.Image)
		}
	})
	cases := []struct {
		name    string
		payload map[string]any
		code    contract.Code
		message string
	}{
		{"S001 missing image", map[string]any{}, contract.S001, "image"},
		{"S001 image of the wrong type", map[string]any{"image": 7}, contract.S001, "image"},
		{"S001 bad env name", map[string]any{"image": s.target.Image, "env": map[string]string{"1BAD": "x"}}, contract.S001, "1BAD"},
		{"S001 env item without =", map[string]any{"image": s.target.Image, "env": []string{"NOEQUALS"}}, contract.S001, "NOEQUALS"},
		{"S001 zero cpus", map[string]any{"image": s.target.Image, "cpus": 0}, contract.S001, "cpus"},
		{"S100 unknown image", map[string]any{"image": "sdktest-no-such-image"}, contract.S100, s.target.Image},
		{"S100 catalog image not on the allowlist", map[string]any{"image": deniedImage}, contract.S100, s.target.Image},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := s.session(t).fail(contract.OpCreate, tc.payload, tc.code)
			if !strings.Contains(e.Message, tc.message) {
				t.Errorf("message %q does not mention %q", e.Message, tc.message)
			}
		})
	}
}

func (s *suite) testExec(t *testing.T) {
	ss := s.session(t)
	id := s.create(ss, map[string]any{"env": map[string]string{"SDKTEST_BOOT": "boot-value"}})

	shapes := []struct {
		name    string
		payload map[string]any
		stdout  string
	}{
		{"cmd with args", map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "printf '%s|%s' \"$0\" \"$1\"", "first", "second"}}, "first|second"},
		{"argv", map[string]any{"argv": []string{"/bin/sh", "-c", "printf argv-ok"}}, "argv-ok"},
		{"cmd split on whitespace", map[string]any{"cmd": "/bin/sh -c 'printf \"split ok\"'"}, "split ok"},
		{"env as a list", map[string]any{"argv": []string{"/bin/sh", "-c", "printf %s \"$A$B\""}, "env": []string{"A=1", "B=2"}}, "12"},
		{"env as a map", map[string]any{"argv": []string{"/bin/sh", "-c", "printf %s \"$A-$B\""}, "env": map[string]string{"B": "y", "A": "x"}}, "x-y"},
		{"boot env reaches exec", map[string]any{"argv": []string{"/bin/sh", "-c", "printf %s \"$SDKTEST_BOOT\""}}, "boot-value"},
		{"exec env wins over boot env", map[string]any{"argv": []string{"/bin/sh", "-c", "printf %s \"$SDKTEST_BOOT\""}, "env": []string{"SDKTEST_BOOT=exec-value"}}, "exec-value"},
		{"stdin", map[string]any{"cmd": "cat", "stdin": base64.StdEncoding.EncodeToString([]byte("from stdin\x00\xff"))}, "from stdin\x00\ufffd"},
	}
	for _, tc := range shapes {
		t.Run(tc.name, func(t *testing.T) {
			ss := s.session(t)
			raw := ss.call(contract.OpExec, Merge(map[string]any{"sandbox_id": id}, tc.payload), nil)
			requireKeys(t, raw, "stdout", "stderr", "exit_code", "timed_out", "duration_ms", "success", "stdout_truncated", "stderr_truncated")
			var out contract.ExecResponse
			_ = json.Unmarshal(raw, &out)
			if out.Stdout != tc.stdout || out.ExitCode == nil || *out.ExitCode != 0 || !out.Success || out.TimedOut {
				t.Errorf("got %s, want stdout %q and exit 0", raw, tc.stdout)
			}
		})
	}

	t.Run("workdir", func(t *testing.T) {
		ss := s.session(t)
		ss.call(contract.OpFsWrite, map[string]any{"sandbox_id": id, "path": "/sdktest-wd/marker.txt", "content": "in the workdir", "parents": true}, nil)
		out := ss.exec(id, map[string]any{"argv": []string{"cat", "marker.txt"}, "workdir": "/sdktest-wd"})
		if out.Stdout != "in the workdir" {
			t.Errorf("cat marker.txt in workdir: %s", js(out))
		}
	})
	t.Run("non-zero exit is a reply", func(t *testing.T) {
		out := s.session(t).sh(id, "echo out; echo err >&2; exit 3", nil)
		if out.ExitCode == nil || *out.ExitCode != 3 || out.Success || out.Stdout != "out\n" || out.Stderr != "err\n" {
			t.Errorf("want exit_code 3, success false, stdout \"out\\n\", stderr \"err\\n\"; got the reply %s", js(out))
		}
	})
	t.Run("missing binary is exit 127", func(t *testing.T) {
		out := s.session(t).exec(id, map[string]any{"argv": []string{"sdktest-no-such-binary"}})
		if out.ExitCode == nil || *out.ExitCode != 127 || out.Success {
			t.Errorf("want exit_code 127 and success false, got the reply %s", js(out))
		}
	})
	t.Run("truncation flags", func(t *testing.T) {
		ss := s.session(t)
		big := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("a", 2<<20)))
		out := ss.exec(id, map[string]any{"argv": []string{"cat"}, "stdin": big})
		if len(out.Stdout) != contract.ExecOutputCap || !out.StdoutTruncated || out.StderrTruncated || !out.Success {
			t.Errorf("2 MiB on stdout: %d bytes kept, stdout_truncated %v, stderr_truncated %v", len(out.Stdout), out.StdoutTruncated, out.StderrTruncated)
		}
		out = ss.sh(id, "cat >&2", map[string]any{"stdin": big})
		if len(out.Stderr) != contract.ExecOutputCap || !out.StderrTruncated || out.StdoutTruncated {
			t.Errorf("2 MiB on stderr: %d bytes kept, stderr_truncated %v, stdout_truncated %v", len(out.Stderr), out.StderrTruncated, out.StdoutTruncated)
		}
		out = ss.sh(id, "printf small", nil)
		if out.StdoutTruncated || out.StderrTruncated {
			t.Errorf("small output flagged as truncated: %s", js(out))
		}
	})
	t.Run("S200 on timeout", func(t *testing.T) {
		e := s.session(t).fail(contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"sleep", "60"}, "timeout_ms": 500}, contract.S200)
		if e.Retryable {
			t.Errorf("S200 must not be retryable")
		}
	})

	errs := []struct {
		name    string
		payload map[string]any
		code    contract.Code
	}{
		{"S001 bad uuid", map[string]any{"sandbox_id": "not-a-uuid", "cmd": "true"}, contract.S001},
		{"S001 missing sandbox_id", map[string]any{"cmd": "true"}, contract.S001},
		{"S001 nothing to run", map[string]any{"sandbox_id": id}, contract.S001},
		{"S001 argv with cmd is ambiguous", map[string]any{"sandbox_id": id, "cmd": "true", "argv": []string{"true"}}, contract.S001},
		{"S001 cmd with whitespace and args is ambiguous", map[string]any{"sandbox_id": id, "cmd": "echo a", "args": []string{"b"}}, contract.S001},
		{"S001 bad env name", map[string]any{"sandbox_id": id, "cmd": "true", "env": map[string]string{"A-B": "x"}}, contract.S001},
		{"S001 stdin not base64", map[string]any{"sandbox_id": id, "cmd": "cat", "stdin": "%%%"}, contract.S001},
		{"S002 unknown sandbox", map[string]any{"sandbox_id": uuid.NewString(), "cmd": "true"}, contract.S002},
	}
	for _, tc := range errs {
		t.Run(tc.name, func(t *testing.T) {
			s.session(t).fail(contract.OpExec, tc.payload, tc.code)
		})
	}
}

func (s *suite) testList(t *testing.T) {
	ss := s.session(t)
	id := s.create(ss, map[string]any{"name": "sdktest-list"})
	raw := ss.call(contract.OpList, map[string]any{}, nil)
	m := requireKeys(t, raw, "sandboxes")
	var items []json.RawMessage
	if err := json.Unmarshal(m["sandboxes"], &items); err != nil {
		t.Fatalf("sandboxes is not an array: %s", m["sandboxes"])
	}
	var found *contract.ListEntry
	for _, it := range items {
		requireKeys(t, it, "sandbox_id", "image", "age_secs", "exec_in_progress", "exec_in_flight", "exec_slots_free", "stopped")
		var e contract.ListEntry
		if err := json.Unmarshal(it, &e); err != nil {
			t.Fatalf("list entry %s: %v", it, err)
		}
		if e.SandboxID == id {
			found = &e
		}
	}
	if found == nil {
		t.Fatalf("sandbox %s missing from %s", id, raw)
	}
	if found.Name != "sdktest-list" || found.Image != s.target.Image || found.Stopped || found.ExecInProgress || found.ExecInFlight != 0 || found.ExecSlotsFree == 0 {
		t.Errorf("list entry %s, want name sdktest-list, image %s, live, no exec in flight and a free slot", js(*found), s.target.Image)
	}

	ss.call(contract.OpStop, map[string]any{"sandbox_id": id}, nil)
	var after contract.ListResponse
	ss.call(contract.OpList, nil, &after)
	for _, e := range after.Sandboxes {
		if e.SandboxID == id && !e.Stopped {
			t.Errorf("a stopped sandbox is listed as live: %s", js(e))
		}
	}
}

func (s *suite) testStop(t *testing.T) {
	t.Run("stop then S004 for everything", func(t *testing.T) {
		ss := s.session(t)
		id := s.create(ss, nil)
		raw := ss.call(contract.OpStop, map[string]any{"sandbox_id": id}, nil)
		requireKeys(t, raw, "sandbox_id", "stopped")
		var out contract.StopResponse
		_ = json.Unmarshal(raw, &out)
		if out.SandboxID != id || !out.Stopped {
			t.Errorf("stop replied %s", raw)
		}
		ss.fail(contract.OpStop, map[string]any{"sandbox_id": id}, contract.S004)
		ss.fail(contract.OpExec, map[string]any{"sandbox_id": id, "cmd": "true"}, contract.S004)
		ss.fail(contract.OpFsStat, map[string]any{"sandbox_id": id, "path": "/"}, contract.S004)
		ss.fail(contract.OpFsWrite, map[string]any{"sandbox_id": id, "path": "/x", "content": "x"}, contract.S004)
	})
	t.Run("stop with wait", func(t *testing.T) {
		ss := s.session(t)
		id := s.create(ss, nil)
		var out contract.StopResponse
		ss.call(contract.OpStop, map[string]any{"sandbox_id": id, "wait": true}, &out)
		if !out.Stopped {
			t.Errorf("stop with wait: want stopped true, got the reply %s", js(out))
		}
		ss.fail(contract.OpExec, map[string]any{"sandbox_id": id, "cmd": "true"}, contract.S004)
	})
	t.Run("stop ends a running exec", func(t *testing.T) {
		ss := s.session(t)
		id := s.create(ss, nil)
		type result struct {
			raw json.RawMessage
			err error
		}
		done := make(chan result, 1)
		go func() {
			raw, err := ss.raw(contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"sleep", "120"}})
			done <- result{raw, err}
		}()
		waitFor(t, "the exec to be in flight", s.target.CallTimeout, func() bool { return execsInFlight(ss, id) == 1 })
		ss.call(contract.OpStop, map[string]any{"sandbox_id": id, "wait": true}, nil)
		// The sleep must end with the sandbox, as S004 (the sandbox is
		// stopped), not as a reply: a hang here is the failure too
		// (bounded by the call timeout). With sandboxkit, a Sandbox.Exec
		// cut off by Stop returns an error, any error, and the kit
		// reports S004.
		r := <-done
		var se *contract.Error
		if !errors.As(r.err, &se) || se.Code != contract.S004 {
			t.Errorf("an exec whose sandbox was stopped under it: want S004, got %s", observed(r.raw, r.err))
		} else {
			checkWireError(t, se)
		}
	})
	t.Run("S002 unknown sandbox", func(t *testing.T) {
		s.session(t).fail(contract.OpStop, map[string]any{"sandbox_id": uuid.NewString()}, contract.S002)
	})
	t.Run("S001 bad uuid", func(t *testing.T) {
		s.session(t).fail(contract.OpStop, map[string]any{"sandbox_id": "42"}, contract.S001)
	})
}

// execsInFlight reads exec_in_flight for id from list (-1 if absent).
func execsInFlight(ss *session, id string) int {
	var out contract.ListResponse
	ss.call(contract.OpList, nil, &out)
	for _, e := range out.Sandboxes {
		if e.SandboxID == id {
			return int(e.ExecInFlight)
		}
	}
	return -1
}
