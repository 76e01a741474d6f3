package server

import (
	"bufio"
	"context"
	"encoding/json"
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

	"github.com/iii-sandbox/iii/compose/daemon"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/protocol"
)

// docTables are the two tables of docs/security.md's "Privileged functions":
// the privileged functions and those that stay open. Each entry is a
// pattern: a function id where <adapter> stands for any adapter name and
// <op> for any operation of the sandbox contract.
type docTables struct {
	privileged, open []*regexp.Regexp
	names            map[*regexp.Regexp]string
}

// loadDocTables reads the tables from docs/security.md: the first cell of
// each row, its backquoted ids.
func loadDocTables(t *testing.T) *docTables {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "security.md"))
	assert.NilError(t, err)
	defer f.Close()
	ops := make([]string, 0, len(contract.Ops()))
	for _, op := range contract.Ops() {
		ops = append(ops, regexp.QuoteMeta(op))
	}
	dt := &docTables{names: map[*regexp.Regexp]string{}}
	var into *[]*regexp.Regexp
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "## Privileged functions":
			into = &dt.privileged
			continue
		case line == "### Functions that stay open":
			into = &dt.open
			continue
		case strings.HasPrefix(line, "#"):
			into = nil
			continue
		}
		m := row.FindStringSubmatch(line)
		if into == nil || m == nil {
			continue
		}
		pat := regexp.QuoteMeta(m[1])
		pat = strings.ReplaceAll(pat, "<adapter>", "[a-z0-9][a-z0-9_-]*")
		pat = strings.ReplaceAll(pat, "<op>", "(?:"+strings.Join(ops, "|")+")")
		re := regexp.MustCompile("^" + pat + "$")
		dt.names[re] = m[1]
		*into = append(*into, re)
	}
	assert.NilError(t, sc.Err())
	assert.Assert(t, len(dt.privileged) > 10 && len(dt.open) > 10, "docs/security.md has both tables")
	return dt
}

// classify says what the docs say of id: privileged or open; ok is false
// when neither table has it.
// An <adapter> row never names the reserved prefixes' ids (no adapter is
// called engine, compose, configuration or sandbox).
func (dt *docTables) classify(id string) (privileged, ok bool, row *regexp.Regexp) {
	first, _, _ := strings.Cut(id, "::")
	reserved := first == "engine" || first == "compose" || first == "configuration" || first == "sandbox"
	matches := func(re *regexp.Regexp) bool {
		return re.MatchString(id) && !(reserved && strings.HasPrefix(dt.names[re], "<adapter>"))
	}
	for _, re := range dt.privileged {
		if matches(re) {
			return true, true, re
		}
	}
	for _, re := range dt.open {
		if matches(re) {
			return false, true, re
		}
	}
	return false, false, nil
}

// callAs invokes fn in ns over a new socket that presents token ("" =
// none) and returns the answer's error code ("" when it succeeded).
func callAs(t *testing.T, addr, token, ns, fn, payload string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := dialSocket(ctx, t, addr, token)
	defer conn.CloseNow()
	frame, err := protocol.Encode(&protocol.InvokeFunction{InvocationID: "c1", FunctionID: fn, Namespace: &ns, Data: json.RawMessage(payload)})
	assert.NilError(t, err)
	assert.NilError(t, conn.Write(ctx, websocket.MessageText, frame))
	for {
		_, data, err := conn.Read(ctx)
		assert.NilError(t, err, "%s in %s", fn, ns)
		m, err := protocol.Decode(data)
		assert.NilError(t, err)
		switch m := m.(type) {
		case *protocol.ErrorFrame:
			return m.Error.Code
		case *protocol.InvocationResult:
			if m.InvocationID != "c1" {
				continue
			}
			if m.Error != nil {
				return m.Error.Code
			}
			return ""
		}
	}
}

// startCompose runs a Compose daemon in process, attached to the engine at
// url, in namespace ns, until the test ends. It is given the engine token
// as $III_ENGINE_TOKEN (the engine's home is not the process's), and
// otherwise sees the process's environment.
func startCompose(t *testing.T, url, ns, token string) {
	t.Helper()
	out := &syncbuf.Buffer{}
	served := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		done <- daemon.Run(ctx, daemon.Options{
			Namespace: ns, EngineURL: url, Cwd: t.TempDir(), Out: out,
			LookupEnv: func(k string) (string, bool) {
				if k == pluginhost.EnvEngineToken {
					return token, true
				}
				return os.LookupEnv(k)
			},
			Logger:   hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Info}),
			Packages: daemon.PackageOptions{Registry: t.TempDir(), Cache: t.TempDir()},
			OnServe:  func(daemon.Info) { close(served) },
		})
	}()
	select {
	case <-served:
	case err := <-done:
		cancel()
		t.Fatalf("the Compose daemon did not start: %v\n%s", err, out.String())
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("the Compose daemon did not start in time\n%s", out.String())
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.Check(t, err, "the Compose daemon: %s", out.String())
		case <-time.After(60 * time.Second):
			t.Error("the Compose daemon did not stop")
		}
	})
}

// TestPrivilegedFunctions walks every function of the assembled engine
// (engine builtins, configuration worker, plugin host, router, an
// adapter's functions, a Compose daemon's) and checks each against
// docs/security.md, where every function is classified privileged or open:
// the registration's mark must agree with the docs; a call without the
// engine token must answer UNAUTHORIZED exactly when the function is
// privileged; and the same call with the token must get past the gate. A
// function the docs do not classify fails the test: whoever adds one
// decides, documents it, and marks it where it is registered.
func TestPrivilegedFunctions(t *testing.T) {
	t.Parallel()
	docs := loadDocTables(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	writeConfig(t, path, listenerConfig(port))
	r := serve(t, path)
	token := r.s.engineToken()
	assert.Assert(t, token != "", "the engine always has a token")

	// An adapter that failed to start (/bin/true is no adapter) is
	// published with all its functions, worker::* among them, so that
	// calls get the reason.
	code, msg := invokeCode(t, r, pluginhost.FnStart, `{"adapter":"sandbox-gone","namespace":"priv","path":"/bin/true"}`)
	assert.Assert(t, code != "", "the adapter cannot start: %s", msg)
	startCompose(t, "ws://"+addr, "priv", token)

	raw, err := r.s.Engine().Invoke(context.Background(), engine.DefaultNamespace, engine.FnFunctionsList, json.RawMessage(`{"include_internal":true}`))
	assert.NilError(t, err)
	var list struct {
		Functions []struct {
			ID        string `json:"function_id"`
			Namespace string `json:"namespace"`
		} `json:"functions"`
	}
	assert.NilError(t, json.Unmarshal(raw, &list))

	seen := map[*regexp.Regexp]bool{}
	for _, f := range list.Functions {
		t.Run(f.Namespace+"/"+f.ID, func(t *testing.T) {
			want, ok, row := docs.classify(f.ID)
			if !ok {
				t.Fatalf("%s is in neither table of docs/security.md (\"Privileged functions\", \"Functions that stay open\"): classify it there, and if it is privileged mark it where it is registered (FunctionDef.Privileged, or metadata {\"privileged\": true})", f.ID)
			}
			seen[row] = true
			got, ok := r.s.Engine().FunctionPrivileged(f.Namespace, f.ID)
			assert.Assert(t, ok)
			assert.Equal(t, got, want, "%s: registered privileged=%v, docs/security.md says %v", f.ID, got, want)

			// A payload that passes the gate but does no harm: compose::*
			// checks its namespace guard first.
			payload := `{}`
			if strings.HasPrefix(f.ID, "compose::") {
				payload = `{"namespace":"not-this-daemon"}`
			}
			anon := callAs(t, addr, "", f.Namespace, f.ID, payload)
			if want {
				assert.Equal(t, anon, engine.CodeUnauthorized, "%s without the token", f.ID)
			} else {
				assert.Check(t, anon != engine.CodeUnauthorized, "%s is open, yet refused without the token", f.ID)
			}
			admin := callAs(t, addr, token, f.Namespace, f.ID, payload)
			assert.Check(t, admin != engine.CodeUnauthorized && admin != engine.CodeAuthError, "%s with the token: %s", f.ID, admin)
		})
	}
	// Every privileged row of the docs names something this engine
	// registers, so none of them goes untested.
	for _, re := range docs.privileged {
		assert.Check(t, seen[re], "docs/security.md lists %s as privileged, but the engine registered nothing it names", docs.names[re])
	}
}
