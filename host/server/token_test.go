package server

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/protocol"
)

// invokeCode calls fn in the default namespace and returns the error code
// and message ("" when the call succeeded).
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

// TestEngineTokenFromConfig: engine_token guards engine::adapters::start,
// stop and restart; list stays open; a reload changes the token.
func TestEngineTokenFromConfig(t *testing.T) {
	t.Setenv(pluginhost.EnvEngineToken, "")
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	writeConfig(t, path, "engine_token: cfg-token-1\n"+listenerConfig(port))
	r := serve(t, path)

	for _, fn := range []string{pluginhost.FnStart, pluginhost.FnStop, pluginhost.FnRestart} {
		code, msg := invokeCode(t, r, fn, `{"adapter":"sandbox-nope"}`)
		assert.Equal(t, code, pluginhost.CodeUnauthorized, fn)
		assert.Check(t, !strings.Contains(msg, "cfg-token-1"))
		code, _ = invokeCode(t, r, fn, `{"adapter":"sandbox-nope","token":"cfg-token-2"}`)
		assert.Equal(t, code, pluginhost.CodeUnauthorized, fn)
	}
	// With the token the call gets past the check (and fails for what it
	// asks: no such adapter here).
	code, _ := invokeCode(t, r, pluginhost.FnStop, `{"adapter":"sandbox-nope","token":"cfg-token-1"}`)
	assert.Equal(t, code, pluginhost.CodeNotStarted)
	code, _ = invokeCode(t, r, pluginhost.FnList, `{}`)
	assert.Equal(t, code, "")

	writeConfig(t, path, "engine_token: cfg-token-2\n"+listenerConfig(port))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if code, _ := invokeCode(t, r, pluginhost.FnStop, `{"adapter":"sandbox-nope","token":"cfg-token-2"}`); code == pluginhost.CodeNotStarted {
			return poll.Success()
		}
		return poll.Continue("the new token is not in force yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
	code, _ = invokeCode(t, r, pluginhost.FnStop, `{"adapter":"sandbox-nope","token":"cfg-token-1"}`)
	assert.Equal(t, code, pluginhost.CodeUnauthorized)
}

// TestEngineTokenEnvWins: III_ENGINE_TOKEN replaces engine_token; without
// either, no token is asked for.
func TestEngineTokenEnvWins(t *testing.T) {
	t.Setenv(pluginhost.EnvEngineToken, "env-token")
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path, "engine_token: cfg-token\n"+listenerConfig(freePort(t)))
	r := serve(t, path)
	code, _ := invokeCode(t, r, pluginhost.FnStop, `{"adapter":"sandbox-nope","token":"cfg-token"}`)
	assert.Equal(t, code, pluginhost.CodeUnauthorized)
	code, _ = invokeCode(t, r, pluginhost.FnStop, `{"adapter":"sandbox-nope","token":"env-token"}`)
	assert.Equal(t, code, pluginhost.CodeNotStarted)

	t.Setenv(pluginhost.EnvEngineToken, "")
	path2 := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path2, listenerConfig(freePort(t)))
	r2 := serve(t, path2)
	code, _ = invokeCode(t, r2, pluginhost.FnStop, `{"adapter":"sandbox-nope"}`)
	assert.Equal(t, code, pluginhost.CodeNotStarted, "no token, no check")
}

// TestConfigurationHidesEngineToken: the configuration worker expands
// ${VAR} in stored values when they are read, so a worker could store
// "${III_ENGINE_TOKEN}" and read the token back; there it reads as unset.
func TestConfigurationHidesEngineToken(t *testing.T) {
	t.Setenv(pluginhost.EnvEngineToken, "env-secret-token")
	t.Setenv("III_TEST_VISIBLE", "visible")
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	writeConfig(t, path, listenerConfig(port))
	serve(t, path)
	w := dial(t, "127.0.0.1:"+strconv.Itoa(port))
	_, errb := w.call(t, "configuration::register", `{"id":"probe","name":"p","description":"d","schema":{"type":"object"},`+
		`"initial_value":{"tok":"${III_ENGINE_TOKEN:hidden}","other":"${III_TEST_VISIBLE:x}"}}`)
	assert.Assert(t, errb == nil, "%v", errb)
	out, errb := w.call(t, "configuration::get", `{"id":"probe"}`)
	assert.Assert(t, errb == nil, "%v", errb)
	assert.Check(t, !strings.Contains(string(out), "env-secret-token"), "%s", out)
	assert.Check(t, is.Contains(string(out), `"tok":"hidden"`))
	assert.Check(t, is.Contains(string(out), `"other":"visible"`))
}
