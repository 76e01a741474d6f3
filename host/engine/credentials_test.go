package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/protocol"
)

// issue calls engine::credentials::issue as admin and returns the token.
func issue(t *testing.T, admin *rawClient, id, payload string) string {
	t.Helper()
	f := admin.call(id, FnCredentialsIssue, nil, payload)
	assert.Assert(t, f.obj("error") == nil, "issue %s: %v", payload, f)
	tok := f.obj("result").str("token")
	assert.Equal(t, len(tok), 64)
	return tok
}

// persist needs a credentials file (the sandbox_host block's checks are
// the router's: host/router/trust_test.go).
func TestIssuePersistWithoutFile(t *testing.T) {
	te := startEngine(t, Options{})
	admin := te.dialAdmin(t)
	code, msg := errBody(t, admin.call("a", FnCredentialsIssue, nil, `{"namespace":"sbx","persist":true}`))
	assert.Equal(t, code, CodeInvalidArgument)
	assert.Check(t, is.Contains(msg, "no credentials file"))
}

// A handshake without a credential, or with one the engine did not issue,
// is refused on a listener that requires one, and registers nothing.
func TestSandboxHostNeedsItsCredential(t *testing.T) {
	te := startEngine(t, Options{})
	url := te.listen(t, ListenerPolicy{Name: "remote-hosts", RequireToken: true})
	for _, tc := range []struct {
		name string
		h    map[string][]string
	}{
		{"none", nil},
		{"unknown", bearerHeader(strings.Repeat("ab", 32))},
		{"not bearer", map[string][]string{"Authorization": {"Basic eDp5"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := dialRefused(t, url, tc.h)
			assert.Equal(t, f.obj("error").str("code"), CodeAuthError)
		})
	}
	assert.Assert(t, !hasFn(te, "sbx", "remote::create"))
}

func newLoggedEngine(t *testing.T) (*testEngine, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	return startEngine(t, Options{Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})}), logs
}

// newScopedEngine is newLoggedEngine with a guard that keeps sandbox_host
// blocks as scopes (hostSpecScope, admitOwnAdapter).
func newScopedEngine(t *testing.T) (*testEngine, *testGuard) {
	t.Helper()
	te, _ := newLoggedEngine(t)
	return te, installGuard(t, te, &testGuard{scope: hostSpecScope, admit: admitOwnAdapter})
}

func closeEngine(t *testing.T, te *testEngine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(t, te.Close(ctx))
}

// Credentials issued with persist survive the engine: a second engine on
// the same file accepts them, with the scope its guard makes of their spec;
// the others end with the first engine. Revoking removes one from the
// file.
func TestPersistedCredentials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", CredentialsFileName)
	first, _ := newScopedEngine(t)
	n, err := first.UseCredentialsFile(path)
	assert.NilError(t, err)
	assert.Equal(t, n, 0, "a missing file is an empty set")
	admin := first.dialAdmin(t)
	kept := issue(t, admin, "1", `{"label":"hosts/h1","namespace":"sbx","persist":true,"sandbox_host":{"adapter":"remote","host_name":"h1"}}`)
	kept2 := issue(t, admin, "2", `{"label":"w","namespace":"orders","allow":{"default":["x::*"]},"persist":true}`)
	lost := issue(t, admin, "3", `{"label":"lost","namespace":"sbx","persist":false}`)

	fi, err := os.Stat(path)
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o600))
	data, err := os.ReadFile(path)
	assert.NilError(t, err)
	for _, tok := range []string{kept, kept2, lost} {
		assert.Check(t, !strings.Contains(string(data), tok), "the file never holds a token")
	}
	sum := sha256.Sum256([]byte(kept))
	assert.Check(t, is.Contains(string(data), hex.EncodeToString(sum[:])))
	var file credentialsFile
	assert.NilError(t, json.Unmarshal(data, &file))
	assert.Equal(t, file.Version, 1)
	assert.Equal(t, len(file.Credentials), 2)
	closeEngine(t, first)

	second, g := newScopedEngine(t)
	n, err = second.UseCredentialsFile(path)
	assert.NilError(t, err)
	assert.Equal(t, n, 2)
	host := second.dialWith(t, bearerHeader(kept))
	host.send(&protocol.RegisterFunction{ID: "remote::create"})
	host.send(&protocol.RegisterFunction{ID: "other::create"})
	host.register(map[string]any{"name": "h1", "namespace": "sbx"})
	assert.Equal(t, host.expect("registrationrejected").str("function_id"), "other::create",
		"the loaded credential keeps its scope")
	pollUntil(t, "registered", func() bool { return hasFn(second, "sbx", "remote::create") })
	o, ok := second.FunctionOwner("sbx", "remote::create")
	assert.Assert(t, ok && o.WorkerID == host.workerID)
	assert.DeepEqual(t, o.Principal.Scope(), protocol.SandboxHostSpec{Adapter: "remote", HostName: "h1"})
	assert.Check(t, !o.Principal.Revoked() && o.Principal.Label() == "hosts/h1")
	reserved, _ := g.snapshot()
	assert.Check(t, is.DeepEqual(reserved, []string{"remote"}), "a loaded credential's claim is reserved")
	second.dialWith(t, bearerHeader(kept2))
	refused := dialRefused(t, second.url, bearerHeader(lost))
	assert.Equal(t, refused.obj("error").str("code"), CodeAuthError)

	// Revoking ends it here and in the file.
	admin2 := second.dialAdmin(t)
	f := admin2.call("4", FnCredentialsRevoke, nil, `{"token":"`+kept+`"}`)
	assert.Equal(t, f.obj("result")["revoked"], true)
	assert.Check(t, host.waitClosed() != nil)
	assert.Check(t, o.Principal.Revoked())
	data, err = os.ReadFile(path)
	assert.NilError(t, err)
	assert.Check(t, !strings.Contains(string(data), hex.EncodeToString(sum[:])))
	closeEngine(t, second)

	third, _ := newScopedEngine(t)
	n, err = third.UseCredentialsFile(path)
	assert.NilError(t, err)
	assert.Equal(t, n, 1)
	refused = dialRefused(t, third.url, bearerHeader(kept))
	assert.Equal(t, refused.obj("error").str("code"), CodeAuthError)
	third.dialWith(t, bearerHeader(kept2))
}

// A credentials file the engine cannot trust or read is refused with a
// logged error and ignored: nothing of it is loaded, the engine runs, and
// persisting is refused until it is fixed.
func TestCredentialsFileRefused(t *testing.T) {
	sum := sha256.Sum256([]byte("tok"))
	h := hex.EncodeToString(sum[:])
	valid := `{"version":1,"credentials":[{"token_sha256":"` + h + `","label":"l","namespace":"sbx"}]}`
	for _, tc := range []struct {
		name    string
		content string
		mode    os.FileMode
		link    bool
		want    string
	}{
		{name: "world-writable", content: valid, mode: 0o666, want: "other users may change it"},
		{name: "group-writable", content: valid, mode: 0o620, want: "other users may change it"},
		{name: "symbolic link", content: valid, mode: 0o600, link: true, want: "symbolic link"},
		{name: "not JSON", content: "nope", mode: 0o600, want: "not a credentials file"},
		{name: "trailing data", content: valid + "{}", mode: 0o600, want: "data after"},
		{name: "other version", content: `{"version":2,"credentials":[]}`, mode: 0o600, want: "version is 2"},
		{name: "unknown field", content: `{"version":1,"credentials":[{"token_sha256":"` + h + `","namespace":"sbx","alow":{}}]}`, mode: 0o600, want: "unknown field"},
		{name: "bad hash", content: `{"version":1,"credentials":[{"token_sha256":"tok","namespace":"sbx"}]}`, mode: 0o600, want: "64 hex digits"},
		{name: "bad spec", content: `{"version":1,"credentials":[{"token_sha256":"` + h + `","namespace":"sbx","queue_provider":true}]}`, mode: 0o600, want: "namespace is default"},
		{name: "a scope without a guard", content: `{"version":1,"credentials":[{"token_sha256":"` + h + `","namespace":"sbx","sandbox_host":{"adapter":"x","host_name":"h"}}]}`, mode: 0o600, want: "no registration guard"},
		{name: "twice", content: `{"version":1,"credentials":[{"token_sha256":"` + h + `","namespace":"a"},{"token_sha256":"` + h + `","namespace":"b"}]}`, mode: 0o600, want: "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, CredentialsFileName)
			target := path
			if tc.link {
				target = filepath.Join(dir, "elsewhere.json")
				assert.NilError(t, os.Symlink(target, path))
			}
			assert.NilError(t, os.WriteFile(target, []byte(tc.content), tc.mode))
			assert.NilError(t, os.Chmod(target, tc.mode))
			te, logs := newLoggedEngine(t)
			n, err := te.UseCredentialsFile(path)
			assert.ErrorContains(t, err, tc.want)
			assert.Equal(t, n, 0)
			assert.Check(t, is.Contains(logs.String(), "credentials file refused"))
			assert.Check(t, is.Contains(logs.String(), tc.want))
			refused := dialRefused(t, te.url, bearerHeader("tok"))
			assert.Equal(t, refused.obj("error").str("code"), CodeAuthError)
			// Persisting does not overwrite the file it refused.
			admin := te.dialAdmin(t)
			code, msg := errBody(t, admin.call("1", FnCredentialsIssue, nil, `{"namespace":"sbx","persist":true}`))
			assert.Equal(t, code, protocol.CodeInvocationFailed)
			assert.Check(t, is.Contains(msg, tc.want))
			after, err := os.ReadFile(target)
			assert.NilError(t, err)
			assert.Equal(t, string(after), tc.content)
			// Without persist the engine still issues.
			issue(t, admin, "2", `{"namespace":"sbx"}`)
		})
	}
}

func FuzzCredentialsFile(f *testing.F) {
	sum := sha256.Sum256([]byte("tok"))
	h := hex.EncodeToString(sum[:])
	f.Add([]byte(`{"version":1,"credentials":[{"token_sha256":"` + h + `","issued_at":"2026-12-01T00:00:00Z","label":"l","namespace":"sbx","allow":{"default":["a::*"]},"sandbox_host":{"adapter":"remote","host_name":"h1"}}]}`))
	f.Add([]byte(`{"version":1,"credentials":[]}`))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"version":1,"credentials":[{"token_sha256":"` + h + `","namespace":"a","persist":true}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &testGuard{scope: hostSpecScope}
		m, err := parseCredentialsFile(data, g)
		if err != nil {
			return
		}
		// What parses encodes to a file that parses to the same.
		out, err := encodeCredentialsFile(m)
		assert.NilError(t, err)
		m2, err := parseCredentialsFile(out, g)
		assert.NilError(t, err)
		assert.DeepEqual(t, m2, m)
	})
}
