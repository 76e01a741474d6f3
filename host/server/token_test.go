package server

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/protocol"
)

// invokeCode calls fn in the default namespace in process (as the engine
// token's holder) and returns the error code and message ("" when the
// call succeeded).
func invokeCode(t *testing.T, r *running, fn, payload string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.s.Engine().Invoke(ctx, "default", fn, json.RawMessage(payload))
	if err == nil {
		return "", ""
	}
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "%v", err)
	return eb.Code, eb.Message
}

// socketCode calls fn over a new socket that presents token ("" = none)
// and returns the error code ("" on success). A refused handshake
// (AUTH_ERROR) is returned as its code.
func socketCode(t *testing.T, addr, token, fn, payload string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := dialSocket(ctx, t, addr, token)
	defer conn.CloseNow()
	_, data, err := conn.Read(ctx)
	assert.NilError(t, err)
	m, err := protocol.Decode(data)
	assert.NilError(t, err)
	if ef, ok := m.(*protocol.ErrorFrame); ok {
		return ef.Error.Code
	}
	frame, err := protocol.Encode(&protocol.InvokeFunction{InvocationID: "c1", FunctionID: fn, Data: json.RawMessage(payload)})
	assert.NilError(t, err)
	assert.NilError(t, conn.Write(ctx, websocket.MessageText, frame))
	for {
		_, data, err := conn.Read(ctx)
		assert.NilError(t, err)
		m, err := protocol.Decode(data)
		assert.NilError(t, err)
		if r, ok := m.(*protocol.InvocationResult); ok && r.InvocationID == "c1" {
			if r.Error != nil {
				return r.Error.Code
			}
			return ""
		}
	}
}

// TestEngineTokenFromConfig: engine_token is the engine token: a socket
// that presents it may call engine::adapters::stop (and gets past the
// gate: the adapter was never started), one without it gets UNAUTHORIZED,
// one with another token is refused at the handshake; list stays open; a
// reload changes the token.
func TestEngineTokenFromConfig(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	writeConfig(t, path, "engine_token: cfg-token-1\n"+listenerConfig(port))
	r := serve(t, path)
	stop := `{"adapter":"sandbox-nope"}`

	for _, fn := range []string{pluginhost.FnStart, pluginhost.FnStop, pluginhost.FnRestart} {
		assert.Equal(t, socketCode(t, addr, "", fn, stop), engine.CodeUnauthorized, fn)
		assert.Equal(t, socketCode(t, addr, "", fn, `{"adapter":"sandbox-nope","token":"cfg-token-1"}`), engine.CodeUnauthorized,
			"%s: the payload's token does not make a connection admin", fn)
	}
	assert.Equal(t, socketCode(t, addr, "cfg-token-2", pluginhost.FnList, `{}`), engine.CodeAuthError)
	assert.Equal(t, socketCode(t, addr, "cfg-token-1", pluginhost.FnStop, stop), pluginhost.CodeNotStarted)
	assert.Equal(t, socketCode(t, addr, "", pluginhost.FnList, `{}`), "")

	writeConfig(t, path, "engine_token: cfg-token-2\n"+listenerConfig(port))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if r.s.engineToken() == "cfg-token-2" {
			return poll.Success()
		}
		return poll.Continue("the new token is not in force yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
	assert.Equal(t, socketCode(t, addr, "cfg-token-2", pluginhost.FnStop, stop), pluginhost.CodeNotStarted)
	assert.Equal(t, socketCode(t, addr, "cfg-token-1", pluginhost.FnStop, stop), engine.CodeAuthError)
}

// TestEngineTokenEnvWins: III_ENGINE_TOKEN replaces engine_token.
func TestEngineTokenEnvWins(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	writeConfig(t, path, "engine_token: cfg-token\n"+listenerConfig(port))
	serveWith(t, path, engineEnv(t, pluginhost.EnvEngineToken, "env-token"), hclog.NewNullLogger())
	assert.Equal(t, socketCode(t, addr, "cfg-token", pluginhost.FnStop, `{"adapter":"sandbox-nope"}`), engine.CodeAuthError)
	assert.Equal(t, socketCode(t, addr, "env-token", pluginhost.FnStop, `{"adapter":"sandbox-nope"}`), pluginhost.CodeNotStarted)
}

// TestEngineTokenFile: with neither III_ENGINE_TOKEN nor engine_token the
// engine uses ~/.iii/engine-token: made on the first start (256 bits, hex,
// 0600), reused by the next, in force for sockets; a reload that drops
// engine_token falls back to it. No token file is touched while another
// token is in force.
func TestEngineTokenFile(t *testing.T) {
	t.Parallel()
	env := engineEnv(t)
	file := filepath.Join(env["HOME"], ".iii", "engine-token")

	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	writeConfig(t, path, "engine_token: cfg-token\n"+listenerConfig(port))
	r := serveWith(t, path, env, hclog.NewNullLogger())
	_, err := os.Stat(file)
	assert.Check(t, errors.Is(err, os.ErrNotExist), "engine_token is in force: no file")

	writeConfig(t, path, listenerConfig(port))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if r.s.engineToken() != "cfg-token" {
			return poll.Success()
		}
		return poll.Continue("engine_token still in force")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
	data, err := os.ReadFile(file)
	assert.NilError(t, err)
	tok := strings.TrimSuffix(string(data), "\n")
	assert.Check(t, regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(tok), "%q", data)
	st, err := os.Stat(file)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	assert.Equal(t, r.s.engineToken(), tok)
	assert.Equal(t, socketCode(t, addr, tok, pluginhost.FnStop, `{"adapter":"sandbox-nope"}`), pluginhost.CodeNotStarted)
	assert.Equal(t, socketCode(t, addr, "", pluginhost.FnStop, `{"adapter":"sandbox-nope"}`), engine.CodeUnauthorized)

	// A second engine (another config) reuses the file's token.
	path2 := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path2, listenerConfig(freePort(t)))
	r2 := serveWith(t, path2, env, hclog.NewNullLogger())
	assert.Equal(t, r2.s.engineToken(), tok)
}

// TestEngineTokenFileRefused: a token file others may read, or that is no
// token, stops the engine from starting, with a message that says what to
// do; so does a home where the file cannot be made.
func TestEngineTokenFileRefused(t *testing.T) {
	t.Parallel()
	// start starts and stops an engine on a config of its own, with env.
	start := func(t *testing.T, env map[string]string) error {
		path := filepath.Join(t.TempDir(), "config.yaml")
		writeConfig(t, path, listenerConfig(freePort(t)))
		s, err := Start(context.Background(), Options{ConfigPath: path, Logger: hclog.NewNullLogger(), Version: "0.26.0", LookupEnv: lookupIn(env)})
		if err == nil {
			assert.NilError(t, s.Close())
		}
		return err
	}
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"readable by others", "tok\n", 0o644, "has mode 0644: other users may read it"},
		{"empty", "", 0o600, "it is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			home := t.TempDir()
			file := filepath.Join(home, ".iii", "engine-token")
			assert.NilError(t, os.MkdirAll(filepath.Dir(file), 0o700))
			assert.NilError(t, os.WriteFile(file, []byte(tc.content), tc.mode))
			assert.NilError(t, os.Chmod(file, tc.mode))
			err := start(t, engineEnv(t, "HOME", home))
			assert.Check(t, is.ErrorContains(err, CodeEngineTokenUnusable+": "))
			assert.Check(t, is.ErrorContains(err, tc.want))
			assert.Check(t, is.ErrorContains(err, "set III_ENGINE_TOKEN or engine_token in config.yaml"))
		})
	}
	t.Run("home unusable", func(t *testing.T) {
		t.Parallel()
		home := filepath.Join(t.TempDir(), "file-not-dir")
		assert.NilError(t, os.WriteFile(home, nil, 0o600))
		err := start(t, engineEnv(t, "HOME", home))
		assert.Check(t, is.ErrorContains(err, CodeEngineTokenUnusable+": "))
		assert.Check(t, is.ErrorContains(err, "not a directory"))
	})
	t.Run("the environment's token needs no file", func(t *testing.T) {
		t.Parallel()
		home := filepath.Join(t.TempDir(), "file-not-dir")
		assert.NilError(t, os.WriteFile(home, nil, 0o600))
		assert.NilError(t, start(t, engineEnv(t, "HOME", home, pluginhost.EnvEngineToken, "env-token")))
	})
}

// TestConfigurationHidesEngineToken: the configuration worker expands
// ${VAR} in stored values when the engine token's holder reads them; the
// token's own variable reads as unset even there.
func TestConfigurationHidesEngineToken(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	writeConfig(t, path, listenerConfig(port))
	serveWith(t, path, engineEnv(t, pluginhost.EnvEngineToken, "env-secret-token", "III_TEST_VISIBLE", "visible"), hclog.NewNullLogger())
	w := dialToken(t, "127.0.0.1:"+strconv.Itoa(port), "env-secret-token")
	_, errb := w.call(t, "configuration::register", `{"id":"probe","name":"p","description":"d","schema":{"type":"object"},`+
		`"initial_value":{"tok":"${III_ENGINE_TOKEN:hidden}","other":"${III_TEST_VISIBLE:x}"}}`)
	assert.Assert(t, errb == nil, "%v", errb)
	out, errb := w.call(t, "configuration::get", `{"id":"probe"}`)
	assert.Assert(t, errb == nil, "%v", errb)
	assert.Check(t, !strings.Contains(string(out), "env-secret-token"), "%s", out)
	assert.Check(t, is.Contains(string(out), `"tok":"hidden"`))
	assert.Check(t, is.Contains(string(out), `"other":"visible"`))
}

// TestConfigurationGetByCaller: configuration::get expands ${HOME}-style
// references from the engine's environment for the engine token's holder
// only; any other connection gets the stored value as written, and may not
// change it.
func TestConfigurationGetByCaller(t *testing.T) {
	t.Parallel()
	env := engineEnv(t, "III_TEST_SECRET_DIR", "/srv/secret-place")
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	writeConfig(t, path, listenerConfig(port))
	r := serveWith(t, path, env, hclog.NewNullLogger())
	admin, worker := dialAdmin(t, r), dial(t, "127.0.0.1:"+strconv.Itoa(port))
	const value = `{"home":"${HOME}","dir":"${III_TEST_SECRET_DIR}/data"}`
	_, errb := worker.call(t, "configuration::register", `{"id":"paths","schema":{"type":"object"},"initial_value":`+value+`}`)
	assert.Assert(t, errb != nil && errb.Code == engine.CodeUnauthorized, "%+v", errb)
	_, errb = admin.call(t, "configuration::register", `{"id":"paths","schema":{"type":"object"},"initial_value":`+value+`}`)
	assert.Assert(t, errb == nil, "%+v", errb)

	out, errb := worker.call(t, "configuration::get", `{"id":"paths"}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, string(out), `{"id":"paths","value":`+value+`}`)
	home := env["HOME"]
	out, errb = admin.call(t, "configuration::get", `{"id":"paths"}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, string(out), `{"id":"paths","value":{"home":"`+home+`","dir":"/srv/secret-place/data"}}`)

	_, errb = worker.call(t, "configuration::set", `{"id":"paths","value":{}}`)
	assert.Assert(t, errb != nil && errb.Code == engine.CodeUnauthorized, "%+v", errb)
}
