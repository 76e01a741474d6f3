package server

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// TestPersistedCredentialsSurviveRestart: a credential issued with
// persist: true is in ~/.iii/engine-credentials.json (0600) and the next
// engine accepts it; one issued without persist ends with its engine.
func TestPersistedCredentialsSurviveRestart(t *testing.T) {
	t.Parallel()
	env := engineEnv(t)
	home := env["HOME"]
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path, listenerConfig(freePort(t)))

	first := serveWith(t, path, env, hclog.NewNullLogger())
	admin := dialAdmin(t, first)
	issue := func(spec string) string {
		out, errb := admin.call(t, engine.FnCredentialsIssue, spec)
		assert.Assert(t, errb == nil, "%v", errb)
		var res struct{ Token string }
		assert.NilError(t, json.Unmarshal(out, &res))
		return res.Token
	}
	kept := issue(`{"label":"hosts/h1","namespace":"sbx","persist":true,"sandbox_host":{"adapter":"remote","host_name":"h1"}}`)
	lost := issue(`{"label":"lost","namespace":"sbx"}`)
	file := filepath.Join(home, ".iii", engine.CredentialsFileName)
	st, err := os.Stat(file)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	first.cancel()
	select {
	case err := <-first.done:
		assert.NilError(t, err)
		first.done <- err
	case <-time.After(30 * time.Second):
		t.Fatal("the first engine did not stop")
	}

	port := freePort(t)
	writeConfig(t, path, listenerConfig(port))
	serveWith(t, path, env, hclog.NewNullLogger())
	addr := "127.0.0.1:" + strconv.Itoa(port)
	dialToken(t, addr, kept) // accepted: its first frame is workerregistered
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := dialSocket(ctx, t, addr, lost)
	defer conn.CloseNow()
	_, data, err := conn.Read(ctx)
	assert.NilError(t, err)
	m, err := protocol.Decode(data)
	assert.NilError(t, err)
	ef, ok := m.(*protocol.ErrorFrame)
	assert.Assert(t, ok, "%s", data)
	assert.Equal(t, ef.Error.Code, engine.CodeAuthError)
}
