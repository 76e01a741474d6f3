package e2e

import (
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
)

// The wire-shape checker the end-to-end tests rely on must refuse every
// deviation from the error object, or their shape checks prove nothing.
func TestParseWire(t *testing.T) {
	good := `{"type":"filesystem","code":"S211","message":"parent directory not found: /a/b","docs_url":"https://x/#s211",` +
		`"retryable":false,"fix":{"parents":true},"fix_note":"merge"}`
	for _, tc := range []struct {
		name, msg, err string
	}{
		{"every key", good, ""},
		{"null fix and note", `{"type":"validation","code":"S001","message":"m","docs_url":"u","retryable":false,"fix":null,"fix_note":null}`, ""},
		{"prefix", "handler error: " + good, "not a JSON object"},
		{"trailing text", good + " and more", "more than the JSON object"},
		{"two objects", good + good, "more than the JSON object"},
		{"null", "null", "JSON null"},
		{"empty", "", "not a JSON object"},
		{"array", "[]", "not a JSON object"},
		{"missing fix", `{"type":"t","code":"S001","message":"m","docs_url":"u","retryable":false,"fix_note":"n"}`, `key "fix" is missing`},
		{"extra key", `{"type":"t","code":"S001","message":"m","docs_url":"u","retryable":false,"fix":null,"fix_note":"n","x":1}`, "8 keys"},
		{"retryable as text", `{"type":"t","code":"S001","message":"m","docs_url":"u","retryable":"no","fix":null,"fix_note":"n"}`, "retryable"},
		{"fix as text", `{"type":"t","code":"S001","message":"m","docs_url":"u","retryable":false,"fix":"parents","fix_note":"n"}`, "fix"},
		{"null message", `{"type":"t","code":"S001","message":null,"docs_url":"u","retryable":false,"fix":null,"fix_note":"n"}`, "message is null"},
		{"not an S-code", `{"type":"t","code":"E001","message":"m","docs_url":"u","retryable":false,"fix":null,"fix_note":"n"}`, "not an S-code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := parseWire(tc.msg)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, sCode.MatchString(w.Code))
		})
	}

	// What the contract package sends parses back to the same error.
	e := contract.ParentNotFound("/a/b/c")
	w, err := parseWire(string(e.ToWire()))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(w.Code, string(e.Code)))
	assert.Check(t, is.Equal(w.Type, e.Type))
	assert.Check(t, is.DeepEqual(w.Fix, e.Fix))
	assert.Check(t, is.Equal(w.FixNote, e.FixNote))
}

func FuzzParseWire(f *testing.F) {
	f.Add(string(contract.ParentNotFound("/x").ToWire()))
	f.Add(string(contract.NewError(contract.S102, "").ToWire()))
	f.Add(`{"type":"t","code":"S001","message":"m","docs_url":"u","retryable":false,"fix":null,"fix_note":null}`)
	f.Add("null")
	f.Fuzz(func(t *testing.T, msg string) {
		w, err := parseWire(msg)
		if err != nil {
			return
		}
		// Whatever parses is a well-formed error object: it encodes back
		// to JSON with the seven keys.
		b, err := json.Marshal(map[string]any{"type": w.Type, "code": w.Code, "message": w.Message, "docs_url": w.DocsURL,
			"retryable": w.Retryable, "fix": w.Fix, "fix_note": w.FixNote})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parseWire(string(b)); err != nil {
			t.Fatalf("a parsed error does not parse again: %v (%s)", err, b)
		}
	})
}
