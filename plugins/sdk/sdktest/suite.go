package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// Target is the adapter under test.
type Target struct {
	// Start (re)starts the adapter with config and returns a Caller for
	// it. The suite calls it several times with different configurations
	// (a small exec cap, per-image caps, a short reaper tick); each call
	// must start a fresh adapter and arrange, with t.Cleanup, that it is
	// shut down. config is the suite's keys merged over Config.
	Start func(t *testing.T, config map[string]any) Caller
	// Image is an image the adapter can run whose root has /bin/sh,
	// sleep and cat. The suite puts it on image_allowlist.
	Image string
	// Config is the adapter's base configuration, for keys of its own.
	Config map[string]any
	// DenyPath, when set, prepares inside the sandbox a path the adapter
	// must refuse to write with S215 and returns it. When nil, the suite
	// uses a directory with mode 0555, which only proves something when
	// the adapter does not act as root; the S215 case is skipped when
	// such a write succeeds.
	DenyPath func(ctx context.Context, t *testing.T, c Caller, sandboxID string) string
	// CallTimeout bounds each call; zero means five minutes (a create may
	// pull an image).
	CallTimeout time.Duration
}

// deniedImage is a custom image the suite adds to the catalog but not to
// the allowlist, to see S100 for an image that exists but is not allowed.
const deniedImage = "sdktest-denied"

// Run runs the conformance suite: every operation, every validation
// code, and the contract's rules, against a fresh adapter from Start.
// Subtests are named after the operation and the rule they check.
func Run(t *testing.T, target Target) {
	t.Helper()
	if target.Start == nil || target.Image == "" {
		t.Fatal("sdktest.Target needs Start and Image")
	}
	if target.CallTimeout == 0 {
		target.CallTimeout = 5 * time.Minute
	}
	base := target.config(nil)
	s := &suite{target: target, c: target.Start(t, base)}

	t.Run("adapter::info", s.testInfo)
	t.Run("catalog::list", s.testCatalog)
	t.Run("create", s.testCreate)
	t.Run("exec", s.testExec)
	t.Run("fs", s.testFs)
	t.Run("fs semantics", s.testFsSemantics)
	t.Run("run", s.testRun)
	t.Run("list", s.testList)
	t.Run("stop", s.testStop)
	t.Run("limits", s.testLimits)
	t.Run("reaper", s.testReaper)
	t.Run("pause", s.testPause)
}

// config is the suite's configuration: the target's base, the suite's
// keys, then extra.
func (target Target) config(extra map[string]any) map[string]any {
	cfg := Merge(target.Config, map[string]any{
		"image_allowlist": []any{target.Image},
		"custom_images":   map[string]any{deniedImage: "registry.invalid/sdktest/denied:1"},
	})
	return Merge(cfg, extra)
}

// Merge returns base with override merged over it: maps merge key by key,
// anything else in override replaces what base has. Neither is changed.
func Merge(base, override map[string]any) map[string]any {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]any{}
	}
	for k, v := range override {
		bm, bok := out[k].(map[string]any)
		om, ook := v.(map[string]any)
		if bok && ook {
			out[k] = Merge(bm, om)
			continue
		}
		out[k] = v
	}
	return out
}

// suite is one run against one target.
type suite struct {
	target Target
	c      Caller
}

// session binds a Caller to a subtest.
type session struct {
	t       *testing.T
	c       Caller
	timeout time.Duration
}

func (s *suite) session(t *testing.T) *session {
	return &session{t: t, c: s.c, timeout: s.target.CallTimeout}
}

func (s *suite) sessionWith(t *testing.T, c Caller) *session {
	return &session{t: t, c: c, timeout: s.target.CallTimeout}
}

// raw calls op and returns the reply or error.
func (ss *session) raw(op string, payload any) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ss.timeout)
	defer cancel()
	return ss.c.Call(ctx, op, payload)
}

// call calls op and decodes its reply into out (when not nil), failing the
// test on any error.
func (ss *session) call(op string, payload any, out any) json.RawMessage {
	ss.t.Helper()
	raw, err := ss.raw(op, payload)
	if err != nil {
		ss.t.Fatalf("%s %s: %v", op, describe(payload), err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			ss.t.Fatalf("%s: reply %s does not decode: %v", op, raw, err)
		}
	}
	return raw
}

// fail calls op, which must fail with code, and returns the error.
func (ss *session) fail(op string, payload any, code contract.Code) *contract.Error {
	ss.t.Helper()
	raw, err := ss.raw(op, payload)
	if err == nil {
		ss.t.Fatalf("%s %s: want %s, got %s", op, describe(payload), code, observed(raw, nil))
	}
	var se *contract.Error
	if !errors.As(err, &se) {
		ss.t.Fatalf("%s %s: want sandbox error %s, got a non-sandbox error: %v", op, describe(payload), code, err)
	}
	if se.Code != code {
		ss.t.Fatalf("%s %s: want %s, got %s: %s", op, describe(payload), code, se.Code, se.Message)
	}
	checkWireError(ss.t, se)
	return se
}

// checkWireError checks the fields every sandbox error carries.
func checkWireError(t *testing.T, se *contract.Error) {
	t.Helper()
	info, ok := contract.LookupCode(se.Code)
	if !ok {
		t.Errorf("error code %s is not in the contract's table", se.Code)
		return
	}
	if se.Type != info.Type || se.Retryable != info.Retryable {
		t.Errorf("%s: type %q retryable %v, want %q %v", se.Code, se.Type, se.Retryable, info.Type, info.Retryable)
	}
	if se.Message == "" || se.DocsURL == "" || se.FixNote == "" {
		t.Errorf("%s: message, docs_url and fix_note must all be set: %+v", se.Code, se)
	}
}

// observed names what a call returned, for failure messages: "a reply
// {…}" with the reply's JSON, "the error S0xx: …", or the non-sandbox error.
func observed(raw json.RawMessage, err error) string {
	if err == nil {
		return "a reply " + truncate(string(raw), 300)
	}
	var se *contract.Error
	if errors.As(err, &se) {
		return fmt.Sprintf("the error %s: %s", se.Code, se.Message)
	}
	return fmt.Sprintf("a non-sandbox error: %v", err)
}

// js renders a decoded reply (or part of one) as JSON for failure
// messages, so pointers such as exit_code show their values.
func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return truncate(string(b), 300)
}

func describe(payload any) string {
	b, err := json.Marshal(payload)
	if err != nil {
		return fmt.Sprintf("%v", payload)
	}
	return truncate(string(b), 200)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// create makes a sandbox of the target's image (plus extra fields) and
// stops it when the test ends.
func (s *suite) create(ss *session, extra map[string]any) string {
	ss.t.Helper()
	payload := Merge(map[string]any{"image": s.target.Image}, extra)
	var out contract.CreateResponse
	raw := ss.call(contract.OpCreate, payload, &out)
	if out.SandboxID == "" {
		ss.t.Fatalf("create %s: want a sandbox_id, got the reply %s", describe(payload), truncate(string(raw), 300))
	}
	ss.t.Cleanup(func() { ss.stopQuietly(out.SandboxID) })
	return out.SandboxID
}

// stopQuietly stops a sandbox at the end of a test; it may already be
// stopped.
func (ss *session) stopQuietly(id string) {
	_, err := ss.raw(contract.OpStop, map[string]any{"sandbox_id": id})
	var se *contract.Error
	if err != nil && !(errors.As(err, &se) && (se.Code == contract.S004 || se.Code == contract.S002)) {
		ss.t.Errorf("stop %s at the end of the test: %v", id, err)
	}
}

// exec runs a command and returns its reply, failing on a sandbox error.
func (ss *session) exec(id string, payload map[string]any) contract.ExecResponse {
	ss.t.Helper()
	var out contract.ExecResponse
	ss.call(contract.OpExec, Merge(map[string]any{"sandbox_id": id}, payload), &out)
	return out
}

// sh runs a /bin/sh script in the sandbox.
func (ss *session) sh(id, script string, extra map[string]any) contract.ExecResponse {
	ss.t.Helper()
	return ss.exec(id, Merge(map[string]any{"argv": []string{"/bin/sh", "-c", script}}, extra))
}

// keys decodes a reply as an object for checks on which keys are present.
func keys(t *testing.T, raw json.RawMessage) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("reply %s is not a JSON object: %v", truncate(string(raw), 200), err)
	}
	return m
}

// requireKeys fails unless every name is a key of raw.
func requireKeys(t *testing.T, raw json.RawMessage, names ...string) map[string]json.RawMessage {
	t.Helper()
	m := keys(t, raw)
	for _, n := range names {
		if _, ok := m[n]; !ok {
			t.Errorf("reply %s has no key %q", truncate(string(raw), 300), n)
		}
	}
	return m
}

// waitFor polls cond every 50 ms until it holds or the deadline passes.
// The deadline is generous: it only bounds how long a broken adapter
// makes the suite wait, never how fast a working one must be.
func waitFor(t *testing.T, what string, deadline time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("gave up after %s waiting for %s", deadline, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
