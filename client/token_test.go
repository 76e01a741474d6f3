package client

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// startTokenEngine serves an engine whose token is tok, with one privileged
// in-process function, test::admin-only, that reports whether its caller is
// admin.
func startTokenEngine(t *testing.T, tok string) string {
	t.Helper()
	eng := engine.New(engine.Options{Version: "test", AdminToken: func() string { return tok }})
	lw, err := eng.AttachLocalWorker(engine.LocalWorkerSpec{Name: "guarded", Namespace: "default"})
	assert.NilError(t, err)
	assert.NilError(t, lw.RegisterFunction(engine.FunctionDef{ID: "test::admin-only", Privileged: true},
		func(_ context.Context, call *engine.Call) (json.RawMessage, error) {
			return json.Marshal(map[string]bool{"admin": call.CallerAdmin})
		}))
	srv := httptest.NewServer(eng.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		assert.NilError(t, eng.Close(ctx))
		srv.Close()
	})
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// TestTokenMakesAdmin: Options.Token is sent as a bearer token; with the
// engine token the connection may call a privileged function, without it
// the call is UNAUTHORIZED, and a token the engine does not know is
// refused at the handshake (AUTH_ERROR).
func TestTokenMakesAdmin(t *testing.T) {
	u := startTokenEngine(t, "the-token")
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	admin := dialEngine(t, u, Options{Name: "admin", Token: "the-token", Reconnect: ReconnectPolicy{Disable: true}})
	res, err := admin.Call(ctx, "test::admin-only", nil)
	assert.NilError(t, err)
	assert.Equal(t, string(res), `{"admin":true}`)

	anon := dialEngine(t, u, Options{Name: "anon", Reconnect: ReconnectPolicy{Disable: true}})
	_, err = anon.Call(ctx, "test::admin-only", nil)
	assert.Equal(t, CodeOf(err), engine.CodeUnauthorized, "%v", err)

	_, err = Dial(ctx, u, Options{Name: "wrong", IgnoreEnv: true, Token: "not-it", Reconnect: ReconnectPolicy{Disable: true}})
	assert.Equal(t, CodeOf(err), engine.CodeAuthError, "%v", err)
	var eb *protocol.ErrorBody
	assert.Check(t, is.ErrorType(err, eb))
	assert.Check(t, !strings.Contains(err.Error(), "not-it"), "the error does not echo the token")
}

// TestDiscoverToken: $III_ENGINE_TOKEN first; else ~/.iii/engine-token for
// an engine on loopback; never the file's token for another host; a file
// others may read is an error; no file is no token.
func TestDiscoverToken(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv(EnvEngineToken, "")
	u := startTokenEngine(t, "file-token")

	tok, err := DiscoverToken(u)
	assert.NilError(t, err)
	assert.Equal(t, tok, "", "no file yet")

	p, err := TokenFile()
	assert.NilError(t, err)
	assert.Equal(t, p, filepath.Join(home, ".iii", "engine-token"))
	assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o700))
	assert.NilError(t, os.WriteFile(p, []byte("file-token\n"), 0o600))
	tok, err = DiscoverToken(u)
	assert.NilError(t, err)
	assert.Equal(t, tok, "file-token")

	tok, err = DiscoverToken("ws://192.0.2.7:49134")
	assert.NilError(t, err)
	assert.Equal(t, tok, "", "a discovered token never goes to another host")

	t.Setenv(EnvEngineToken, "env-token")
	tok, err = DiscoverToken("ws://192.0.2.7:49134")
	assert.NilError(t, err)
	assert.Equal(t, tok, "env-token", "an explicit token is the user's choice")
	t.Setenv(EnvEngineToken, "")

	assert.NilError(t, os.Chmod(p, 0o644))
	_, err = DiscoverToken(u)
	assert.Check(t, is.ErrorContains(err, "other users may read it"))
	assert.NilError(t, os.Chmod(p, 0o600))

	// The discovered token makes the connection admin.
	tok, err = DiscoverToken(u)
	assert.NilError(t, err)
	c := dialEngine(t, u, Options{Name: "discovered", Token: tok, Reconnect: ReconnectPolicy{Disable: true}})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	res, err := c.Call(ctx, "test::admin-only", nil)
	assert.NilError(t, err)
	assert.Equal(t, string(res), `{"admin":true}`)
}
