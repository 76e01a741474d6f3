package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/iii-sandbox/iii/protocol"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
)

// allCodes lists the constants; the table must hold each exactly once.
var allCodes = []Code{
	S001, S002, S003, S004, S005, S006, S100, S101, S102, S200,
	S210, S211, S212, S213, S214, S215, S216, S217, S218, S219,
	S300, S301, S302, S303, S400, S501,
}

func TestCodeTable(t *testing.T) {
	table := Codes()
	assert.Equal(t, len(table), len(allCodes))
	seen := map[Code]bool{}
	validTypes := map[string]bool{TypeValidation: true, TypeConfig: true, TypeInternal: true, TypeTransient: true,
		TypeExecution: true, TypeFilesystem: true, TypePlatform: true}
	for i, c := range table {
		assert.Equal(t, c.Code, allCodes[i], "the table is in code order")
		assert.Assert(t, !seen[c.Code], "%s twice", c.Code)
		seen[c.Code] = true
		assert.Assert(t, validTypes[c.Type], "%s has type %q", c.Code, c.Type)
		assert.Assert(t, c.Title != "" && c.FixNote != "", "%s lacks a title or fix note", c.Code)
	}

	// The facts the spec pins (§7.5 and the router's codes).
	want := map[Code]struct {
		typ       string
		retryable bool
	}{
		S001: {TypeValidation, false}, S002: {TypeValidation, false}, S003: {TypeValidation, false}, S004: {TypeValidation, false},
		S005: {TypeValidation, false}, S006: {TypeValidation, false},
		S100: {TypeConfig, false}, S101: {TypeInternal, false}, S102: {TypeTransient, true}, S200: {TypeExecution, false},
		S210: {TypeFilesystem, false}, S211: {TypeFilesystem, false}, S217: {TypeFilesystem, false},
		S218: {TypeTransient, true}, S219: {TypeFilesystem, false}, S300: {TypePlatform, false},
		S301: {TypePlatform, true}, S302: {TypePlatform, false}, S303: {TypeConfig, false},
		S400: {TypeConfig, false}, S501: {TypeConfig, false},
	}
	for code, w := range want {
		info, ok := LookupCode(code)
		assert.Assert(t, ok, code)
		assert.Equal(t, info.Type, w.typ, code)
		assert.Equal(t, info.Retryable, w.retryable, code)
	}
	_, ok := LookupCode("S999")
	assert.Assert(t, !ok)
}

func TestDocsURL(t *testing.T) {
	assert.Equal(t, DocsURL(S211), "https://iii.dev/docs/next/creating-workers/sandboxes#s211")
	assert.Equal(t, NewError(S501, "").DocsURL, DocsBase+"#s501")
}

// TestErrorWireGolden pins the JSON wire object of every code (with its
// default message) and of the constructors with fixed shapes.
func TestErrorWireGolden(t *testing.T) {
	for _, c := range Codes() {
		t.Run(string(c.Code), func(t *testing.T) {
			golden.Assert(t, string(NewError(c.Code, "").ToWire())+"\n", "errors/"+string(c.Code)+".json")
		})
	}
	special := map[string]*Error{
		"S211-parents":  ParentNotFound("/a/b/c"),
		"run-step":      WrapRunStep(RunStepWriteCode, "1b4e6709-f265-4142-9178-3a7d83b46aa5", ParentNotFound("/tmp/run.py")),
		"run-create":    WrapRunStep(RunStepCreate, "", NewError(S100, "image %q is not allowed", "ruby")),
		"S301-adapter":  AdapterNotRunning("sandbox-libkrun", "dev", "the adapter rejected its configuration: max_concurrent_sandboxes must be a number"),
		"S302-contract": CheckContract("sandbox-libkrun", ContractVersion{Major: 2, Minor: 0}),
		"S303-unbound":  NoAdapterBound(),
		"S501-roots":    HostRootRefused("/home/u/shared", []string{"/home/u/proj", "/home/u/.iii/compose/packages"}),
	}
	for name, e := range special {
		t.Run(name, func(t *testing.T) {
			golden.Assert(t, string(e.ToWire())+"\n", "errors/"+name+".json")
		})
	}
}

func TestNewError(t *testing.T) {
	e := NewError(S003, "sandbox %s runs %d execs", "abc", 4)
	assert.Equal(t, e.Message, "sandbox abc runs 4 execs")
	assert.Equal(t, e.Error(), "S003: sandbox abc runs 4 execs")
	assert.Assert(t, e.Fix == nil)
	assert.Assert(t, is.Contains(e.FixNote, "nohup"))

	// A code outside the table still makes a usable error.
	u := NewError("S777", "")
	assert.Equal(t, u.Type, TypeInternal)
	assert.Equal(t, u.Message, "sandbox error")
	assert.Equal(t, u.DocsURL, DocsBase+"#s777")
}

func TestWithFixDoesNotAlias(t *testing.T) {
	base := NewError(S211, "parent directory not found: /x/y")
	fix := map[string]any{"parents": true}
	withFix := base.WithFix(fix)
	fix["parents"] = false
	assert.Assert(t, base.Fix == nil, "the original keeps no fix")
	assert.Equal(t, withFix.Fix["parents"], true, "the fix was copied")
	assert.Assert(t, is.Contains(withFix.FixNote, "parents: true"))
	assert.Equal(t, base.FixNote, "the path does not exist in the sandbox; check it with sandbox::fs::ls")

	generic := NewError(S001, "").WithFix(map[string]any{"cmd": "ls"})
	assert.Equal(t, generic.FixNote, mergeFixNote)
	assert.Equal(t, generic.WithFixNote("n").FixNote, "n")
}

func TestWrapRunStep(t *testing.T) {
	inner := NewError(S218, "stream closed")
	e := WrapRunStep(RunStepWriteFile, "sb-1", inner)
	assert.Equal(t, e.Code, S218)
	assert.Equal(t, e.Type, TypeTransient)
	assert.Assert(t, e.Retryable)
	assert.Equal(t, e.Message, "during sandbox::run step `fs::write (sibling file)` (sandbox_id=sb-1): stream closed")
	assert.DeepEqual(t, e.Fix, map[string]any{
		"context": "during sandbox::run step `fs::write (sibling file)`", "sandbox_id": "sb-1", "inner_code": "S218",
	})
	assert.Equal(t, WrapRunStep(RunStepExec, "", nil).Code, S300, "a nil inner error does not panic")
}

func TestAsErrorAndIsCode(t *testing.T) {
	assert.Assert(t, AsError(nil, S300) == nil)
	e := NewError(S214, "")
	wrapped := fmt.Errorf("rm: %w", e)
	assert.Equal(t, AsError(wrapped, S216), e)
	assert.Assert(t, IsCode(wrapped, S214))
	assert.Assert(t, !IsCode(wrapped, S211))
	plain := AsError(errors.New("disk on fire"), S216)
	assert.Equal(t, plain.Code, S216)
	assert.Equal(t, plain.Message, "disk on fire")
}

func TestErrorBody(t *testing.T) {
	e := ParentNotFound("/a/b")
	body := e.ErrorBody()
	assert.Equal(t, body.Code, "S211")
	assert.Equal(t, body.Message, string(e.ToWire()))
	back, ok := FromErrorBody(body)
	assert.Assert(t, ok)
	assert.DeepEqual(t, back, e)
	_, ok = FromErrorBody(nil)
	assert.Assert(t, !ok)
	_, ok = FromErrorBody(&protocol.ErrorBody{Code: "invocation_failed", Message: "boom"})
	assert.Assert(t, !ok)
}

func TestToWireKeepsErrorWithUnencodableFix(t *testing.T) {
	e := NewError(S001, "x").WithFix(map[string]any{"bad": make(chan int)})
	var back map[string]any
	assert.NilError(t, json.Unmarshal(e.ToWire(), &back))
	assert.Equal(t, back["code"], "S001")
	assert.Assert(t, back["fix"] == nil)
}

func TestParseWire(t *testing.T) {
	wire := string(ParentNotFound("/a").ToWire())
	cases := []struct {
		name string
		msg  string
		ok   bool
		code Code
	}{
		{"bare", wire, true, S211},
		{"handler error prefix", "handler error: " + wire, true, S211},
		{"trailing text", wire + " (after 3 attempts)", true, S211},
		{"upstream shape with null note and nested fix",
			`{"type":"filesystem","code":"S216","message":"io {x}","docs_url":"u","retryable":false,"fix":{"a":{"b":[1]}},"fix_note":null}`, true, S216},
		{"no object", "handler error: boom", false, ""},
		{"not json", "{nope", false, ""},
		{"no code", `{"type":"validation","message":"x"}`, false, ""},
		{"compose code", `{"code":"NOT_FOUND","message":"x"}`, false, ""},
		{"first object is not an error", `{"a":1} {"code":"S001"}`, false, ""},
		{"array", `[{"code":"S001"}]`, true, S001},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, ok := ParseWire(tc.msg)
			assert.Equal(t, ok, tc.ok)
			if ok {
				assert.Equal(t, e.Code, tc.code)
			}
		})
	}

	e, ok := ParseWire("handler error: " + wire)
	assert.Assert(t, ok)
	assert.DeepEqual(t, e, ParentNotFound("/a"))
}

func FuzzParseWire(f *testing.F) {
	f.Add(string(ParentNotFound("/a").ToWire()))
	f.Add("handler error: " + string(WrapRunStep(RunStepExec, "x", NewError(S200, "")).ToWire()))
	f.Add(`{"code":"S001","fix":{"n":1.5e300},"fix_note":null}`)
	f.Add(`{"code":"S001"`)
	f.Add("")
	f.Fuzz(func(t *testing.T, msg string) {
		e, ok := ParseWire(msg)
		if !ok {
			return
		}
		if !isSandboxCode(string(e.Code)) {
			t.Fatalf("accepted code %q", e.Code)
		}
		// What ParseWire accepts survives a trip through ToWire; invalid
		// UTF-8 is already replaced by the JSON decoder, so the second
		// trip is exact.
		again, ok := ParseWire(string(e.ToWire()))
		if !ok {
			t.Fatalf("re-encoded error no longer parses: %s", e.ToWire())
		}
		if string(again.ToWire()) != string(e.ToWire()) {
			t.Fatalf("round trip changed the error:\n%s\n%s", e.ToWire(), again.ToWire())
		}
		_ = strings.ToLower(again.Message)
	})
}
