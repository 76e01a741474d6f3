package configuration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env map[string]string

func (e env) lookup(k string) (string, bool) {
	v, ok := e[k]
	return v, ok
}

type fixture struct {
	w    *Worker
	dir  string
	logs *syncbuf.Buffer
	env  *sync.Map
}

// newWorker opens a worker over an fs store in a temp dir, with a fast
// watcher so hand edits land quickly.
func newWorker(t *testing.T, vars env) *fixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "config")
	return openWorker(t, dir, vars)
}

func openWorker(t *testing.T, dir string, vars env) *fixture {
	t.Helper()
	f := &fixture{dir: dir, logs: &syncbuf.Buffer{}, env: &sync.Map{}}
	for k, v := range vars {
		f.env.Store(k, v)
	}
	f.w = New(Options{
		Logger:  hclog.New(&hclog.LoggerOptions{Output: f.logs, Level: hclog.Debug}),
		Version: "0.26.0",
		Lookup: func(k string) (string, bool) {
			v, ok := f.env.Load(k)
			if !ok {
				return "", false
			}
			return v.(string), true
		},
		Store: NewFSStore(FSOptions{Dir: dir, PollInterval: 5 * time.Millisecond, Debounce: 20 * time.Millisecond}),
	})
	assert.NilError(t, f.w.Open(context.Background()))
	t.Cleanup(f.w.Close)
	return f
}

const portSchema = `{"type":"object","properties":{"port":{"type":"integer","minimum":1,"maximum":65535},"host":{"type":"string"}},"required":["port"],"additionalProperties":false}`

func (f *fixture) register(t *testing.T, id, schema, initial string) *Entry {
	t.Helper()
	req := RegisterRequest{ID: id, Name: id + " settings", Description: "test entry", Schema: json.RawMessage(schema)}
	if initial != "" {
		req.InitialValue = json.RawMessage(initial)
	}
	e, err := f.w.Register(context.Background(), req)
	assert.NilError(t, err)
	return e
}

func (f *fixture) get(t *testing.T, id string, raw bool) string {
	t.Helper()
	v, err := f.w.Get(context.Background(), id, raw)
	assert.NilError(t, err)
	return string(v)
}

func TestRegisterSetGet(t *testing.T) {
	f := newWorker(t, nil)
	e := f.register(t, "http", portSchema, `{"port": 8080, "host": "127.0.0.1"}`)
	assert.DeepEqual(t, e, &Entry{
		ID: "http", Name: "http settings", Description: "test entry",
		Schema: json.RawMessage(portSchema), Value: json.RawMessage(`{"port":8080,"host":"127.0.0.1"}`),
	})
	assert.Equal(t, f.get(t, "http", false), `{"port":8080,"host":"127.0.0.1"}`)

	old, cur, err := f.w.Set(context.Background(), "http", json.RawMessage(`{"port": 9090}`))
	assert.NilError(t, err)
	assert.Equal(t, string(old), `{"port":8080,"host":"127.0.0.1"}`)
	assert.Equal(t, string(cur), `{"port":9090}`)
	assert.Equal(t, f.get(t, "http", false), `{"port":9090}`)

	// The file holds id, name, description and value; never the schema.
	data, err := os.ReadFile(filepath.Join(f.dir, "http.yaml"))
	assert.NilError(t, err)
	assert.Equal(t, string(data), "id: http\nname: http settings\ndescription: test entry\nvalue:\n  port: 9090\n")
	// Atomic writes leave no temporary files behind.
	des, err := os.ReadDir(f.dir)
	assert.NilError(t, err)
	assert.Equal(t, len(des), 1)
}

func TestRegisterKeepsOrReplacesValue(t *testing.T) {
	f := newWorker(t, nil)
	f.register(t, "http", portSchema, `{"port": 1}`)
	e := f.register(t, "http", portSchema, "")
	assert.Equal(t, string(e.Value), `{"port":1}`, "re-register without initial_value keeps the value")
	e = f.register(t, "http", portSchema, `{"port": 2}`)
	assert.Equal(t, string(e.Value), `{"port":2}`, "initial_value replaces it")
	// A new name is written through to the file.
	_, err := f.w.Register(context.Background(), RegisterRequest{ID: "http", Name: "HTTP", Schema: json.RawMessage(portSchema)})
	assert.NilError(t, err)
	data, _ := os.ReadFile(filepath.Join(f.dir, "http.yaml"))
	assert.Assert(t, strings.Contains(string(data), "name: HTTP\n"), string(data))
	// A registration without a value creates no file.
	f.register(t, "empty", `{"type":"object"}`, "")
	_, err = os.Stat(filepath.Join(f.dir, "empty.yaml"))
	assert.Assert(t, errors.Is(err, os.ErrNotExist))
	assert.Equal(t, f.get(t, "empty", false), "null")
	// Name defaults to the id.
	e, err = f.w.Register(context.Background(), RegisterRequest{ID: "noname", Schema: json.RawMessage(`true`)})
	assert.NilError(t, err)
	assert.Equal(t, e.Name, "noname")
}

func TestEnsure(t *testing.T) {
	tests := []struct {
		name    string
		stored  string // "" = nothing stored
		initial string
		want    string
	}{
		{name: "seeds an absent value", initial: `{"on":true}`, want: `{"on":true}`},
		{name: "keeps false", stored: `false`, initial: `true`, want: `false`},
		{name: "keeps zero", stored: `0`, initial: `5`, want: `0`},
		{name: "keeps empty string", stored: `""`, initial: `"x"`, want: `""`},
		{name: "seeds over a stored null", stored: `null`, initial: `7`, want: `7`},
		{name: "no initial keeps nothing", want: `null`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newWorker(t, nil)
			ctx := context.Background()
			if tc.stored != "" {
				f.register(t, "flag", `{}`, "")
				_, _, err := f.w.Set(ctx, "flag", json.RawMessage(tc.stored))
				assert.NilError(t, err)
			}
			req := RegisterRequest{ID: "flag", Name: "flag", Schema: json.RawMessage(`{}`)}
			if tc.initial != "" {
				req.InitialValue = json.RawMessage(tc.initial)
			}
			e, err := f.w.Ensure(ctx, req)
			assert.NilError(t, err)
			assert.Equal(t, string(e.Value), tc.want)
			assert.Equal(t, f.get(t, "flag", true), tc.want)
		})
	}
}

func TestGetExpansion(t *testing.T) {
	f := newWorker(t, env{"PORT": "9000", "HOST": "example.internal", "DEBUG": "true", "EMPTY": ""})
	f.register(t, "app", `{}`, `{
		"port": "${PORT:3111}",
		"fallback_port": "${NOPE:3111}",
		"url": "http://${HOST}:${PORT}/",
		"debug": "${DEBUG}",
		"missing": "${NOT_SET}",
		"missing_embedded": "x-${NOT_SET}-y",
		"empty": "${EMPTY}",
		"list_text": "${LIST:[1, 2]}",
		"float": "${F:1.5}",
		"nan": "${N:.nan}",
		"version": "${IMAGE_TAG:__III_ENGINE_VERSION__}",
		"nested": {"items": ["${PORT}", 1]},
		"${PORT}": "keys are not expanded"
	}`)
	assert.Equal(t, f.get(t, "app", false),
		`{"port":9000,"fallback_port":3111,"url":"http://example.internal:9000/","debug":true,"missing":"${NOT_SET}",`+
			`"missing_embedded":"x-${NOT_SET}-y","empty":null,"list_text":"[1, 2]","float":1.5,"nan":".nan","version":"0.26.0",`+
			`"nested":{"items":[9000,1]},"${PORT}":"keys are not expanded"}`)
	// raw returns the template.
	assert.Assert(t, strings.Contains(f.get(t, "app", true), `"port":"${PORT:3111}"`))
	// Every read sees the live environment.
	f.env.Store("PORT", "9100")
	assert.Assert(t, strings.Contains(f.get(t, "app", false), `"port":9100`))
}

func TestList(t *testing.T) {
	f := newWorker(t, nil)
	f.register(t, "zeta", `{"type":"object"}`, `{}`)
	_, err := f.w.Register(context.Background(), RegisterRequest{ID: "alpha", Name: "A", Schema: json.RawMessage(`{"type":"string"}`), Metadata: json.RawMessage(`{"owner":"x"}`)})
	assert.NilError(t, err)
	got, err := json.Marshal(f.w.List(context.Background()))
	assert.NilError(t, err)
	assert.Equal(t, string(got), `[{"id":"alpha","name":"A","description":"","schema":{"type":"string"},"metadata":{"owner":"x"}},`+
		`{"id":"zeta","name":"zeta settings","description":"test entry","schema":{"type":"object"}}]`)
}

func TestInMemory(t *testing.T) {
	f := newWorker(t, nil)
	ctx := context.Background()
	assert.NilError(t, f.w.SetInMemory("dev-sandbox-libkrun", json.RawMessage(`{"image_allowlist":["python"],"dir":"${HOME_DIR:/tmp}"}`)))
	assert.Equal(t, f.get(t, "dev-sandbox-libkrun", false), `{"image_allowlist":["python"],"dir":"/tmp"}`)
	assert.Equal(t, f.get(t, "dev-sandbox-libkrun", true), `{"image_allowlist":["python"],"dir":"${HOME_DIR:/tmp}"}`)

	_, _, err := f.w.Set(ctx, "dev-sandbox-libkrun", json.RawMessage(`{}`))
	assertCode(t, err, CodeNotRegistered)
	_, err = f.w.Register(ctx, RegisterRequest{ID: "dev-sandbox-libkrun", Schema: json.RawMessage(`{}`)})
	assertCode(t, err, CodeInvalidID)
	_, err = f.w.Schema(ctx, "dev-sandbox-libkrun")
	assertCode(t, err, CodeNotFound)

	// Never written to disk.
	_, err = os.Stat(f.dir)
	assert.Assert(t, errors.Is(err, os.ErrNotExist))

	// Replacing and clearing.
	assert.NilError(t, f.w.SetInMemory("dev-sandbox-libkrun", json.RawMessage(`{"v":2}`)))
	assert.Equal(t, f.get(t, "dev-sandbox-libkrun", true), `{"v":2}`)
	f.w.ClearInMemory("dev-sandbox-libkrun")
	_, err = f.w.Get(ctx, "dev-sandbox-libkrun", false)
	assertCode(t, err, CodeNotFound)

	assertCode(t, f.w.SetInMemory("Bad", json.RawMessage(`1`)), CodeInvalidID)
	assertCode(t, f.w.SetInMemory("ok", json.RawMessage(`{`)), CodeInvalidRequest)
}

func assertCode(t *testing.T, err error, code string) {
	t.Helper()
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "got %v", err)
	assert.Equal(t, eb.Code, code, eb.Message)
}

// TestRestart: values survive a restart, schemas do not: until the owner
// registers again, set fails with SCHEMA_UNAVAILABLE.
func TestRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "config")
	ctx := context.Background()
	first := openWorker(t, dir, nil)
	first.register(t, "http", portSchema, `{"port": 8080}`)
	first.w.Close()

	second := openWorker(t, dir, nil)
	assert.Equal(t, second.get(t, "http", false), `{"port":8080}`)
	_, _, err := second.w.Set(ctx, "http", json.RawMessage(`{"port":1}`))
	assertCode(t, err, CodeSchemaUnavailable)
	_, err = second.w.Schema(ctx, "http")
	assertCode(t, err, CodeSchemaUnavailable)
	list := second.w.List(ctx)
	assert.Equal(t, len(list), 1)
	assert.Equal(t, string(list[0].Schema), "null")
	assert.Equal(t, list[0].Name, "http settings")

	second.register(t, "http", portSchema, "")
	assert.Equal(t, second.get(t, "http", false), `{"port":8080}`)
	_, _, err = second.w.Set(ctx, "http", json.RawMessage(`{"port":1}`))
	assert.NilError(t, err)
}

func TestErrorMessages(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		code string
		run  func(f *fixture) error
	}{
		{name: "get_invalid_id", code: CodeInvalidID, run: func(f *fixture) error { _, err := f.w.Get(ctx, "Bad Id", false); return err }},
		{name: "get_long_id", code: CodeInvalidID, run: func(f *fixture) error { _, err := f.w.Get(ctx, strings.Repeat("a", 65), false); return err }},
		{name: "get_not_found", code: CodeNotFound, run: func(f *fixture) error { _, err := f.w.Get(ctx, "iii-sandbox", true); return err }},
		{name: "schema_not_found", code: CodeNotFound, run: func(f *fixture) error { _, err := f.w.Schema(ctx, "nope"); return err }},
		{name: "set_not_registered", code: CodeNotRegistered, run: func(f *fixture) error { _, _, err := f.w.Set(ctx, "iii-sandbox", json.RawMessage(`{}`)); return err }},
		{name: "set_in_memory", code: CodeNotRegistered, run: func(f *fixture) error {
			_ = f.w.SetInMemory("dev-sandbox-libkrun", json.RawMessage(`{}`))
			_, _, err := f.w.Set(ctx, "dev-sandbox-libkrun", json.RawMessage(`{}`))
			return err
		}},
		{name: "register_in_memory", code: CodeInvalidID, run: func(f *fixture) error {
			_ = f.w.SetInMemory("dev-sandbox-libkrun", json.RawMessage(`{}`))
			_, err := f.w.Register(ctx, RegisterRequest{ID: "dev-sandbox-libkrun", Schema: json.RawMessage(`{}`)})
			return err
		}},
		{name: "register_bad_schema", code: CodeSchemaInvalid, run: func(f *fixture) error {
			_, err := f.w.Register(ctx, RegisterRequest{ID: "x", Schema: json.RawMessage(`{"type": 5}`)})
			return err
		}},
		{name: "register_schema_not_object", code: CodeSchemaInvalid, run: func(f *fixture) error {
			_, err := f.w.Register(ctx, RegisterRequest{ID: "x", Schema: json.RawMessage(`"string"`)})
			return err
		}},
		{name: "register_external_ref", code: CodeSchemaInvalid, run: func(f *fixture) error {
			_, err := f.w.Register(ctx, RegisterRequest{ID: "x", Schema: json.RawMessage(`{"$ref":"file:///etc/passwd"}`)})
			return err
		}},
		{name: "register_no_schema", code: CodeInvalidRequest, run: func(f *fixture) error {
			_, err := f.w.Register(ctx, RegisterRequest{ID: "x"})
			return err
		}},
		{name: "register_bad_initial", code: CodeSchemaInvalid, run: func(f *fixture) error {
			_, err := f.w.Register(ctx, RegisterRequest{ID: "http", Schema: json.RawMessage(portSchema), InitialValue: json.RawMessage(`{"port":0,"extra":1}`)})
			return err
		}},
		{name: "set_every_violation", code: CodeSchemaInvalid, run: func(f *fixture) error {
			_, err := f.w.Register(ctx, RegisterRequest{ID: "http", Schema: json.RawMessage(portSchema)})
			if err != nil {
				return err
			}
			_, _, err = f.w.Set(ctx, "http", json.RawMessage(`{"port":"80","host":7,"tls":true}`))
			return err
		}},
		{name: "set_expanded_violation", code: CodeSchemaInvalid, run: func(f *fixture) error {
			_, err := f.w.Register(ctx, RegisterRequest{ID: "http", Schema: json.RawMessage(portSchema)})
			if err != nil {
				return err
			}
			_, _, err = f.w.Set(ctx, "http", json.RawMessage(`{"port":"${BAD_PORT:99999}"}`))
			return err
		}},
		{name: "set_schema_unavailable", code: CodeSchemaUnavailable, run: func(f *fixture) error {
			if err := os.MkdirAll(f.dir, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(f.dir, "late.yaml"), []byte("id: late\nname: Late\ndescription: ''\nvalue: 1\n"), 0o644); err != nil {
				return err
			}
			if err := f.w.SwapStore(ctx, NewFSStore(FSOptions{Dir: f.dir})); err != nil {
				return err
			}
			_, _, err := f.w.Set(ctx, "late", json.RawMessage(`2`))
			return err
		}},
		{name: "set_adapter_error", code: CodeAdapterError, run: func(f *fixture) error {
			if err := os.WriteFile(f.dir, []byte("a file where the directory should be"), 0o644); err != nil {
				return err
			}
			_, err := f.w.Register(ctx, RegisterRequest{ID: "http", Schema: json.RawMessage(portSchema)})
			if err != nil {
				return err
			}
			_, _, err = f.w.Set(ctx, "http", json.RawMessage(`{"port":1}`))
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newWorker(t, nil)
			err := tc.run(f)
			assertCode(t, err, tc.code)
			msg := strings.ReplaceAll(err.Error(), f.dir, "<dir>")
			golden.Assert(t, msg+"\n", "errors/"+tc.name+".golden")
		})
	}
}

func TestSwapStore(t *testing.T) {
	ctx := context.Background()
	f := newWorker(t, nil)
	f.register(t, "http", portSchema, `{"port": 1}`)
	assert.NilError(t, f.w.SetInMemory("mem", json.RawMessage(`true`)))

	other := filepath.Join(t.TempDir(), "other")
	assert.NilError(t, os.MkdirAll(other, 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(other, "http.yaml"), []byte("id: http\nname: h\ndescription: d\nvalue: {port: 2}\n"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(other, "bad.yaml"), []byte("id: http\n"), 0o644))
	assert.NilError(t, f.w.SwapStore(ctx, NewFSStore(FSOptions{Dir: other, PollInterval: 5 * time.Millisecond, Debounce: 20 * time.Millisecond})))
	assert.Equal(t, f.w.StoreDescription(), "fs:"+other)
	assert.Equal(t, f.get(t, "http", false), `{"port":2}`)
	assert.Equal(t, f.get(t, "mem", false), `true`)
	_, _, err := f.w.Set(ctx, "http", json.RawMessage(`{"port":3}`))
	assert.NilError(t, err, "the registration survives the swap")
	data, _ := os.ReadFile(filepath.Join(other, "http.yaml"))
	assert.Assert(t, strings.Contains(string(data), "port: 3"))
	assert.Assert(t, strings.Contains(f.logs.String(), `id \"http\" does not match the file name bad.yaml`), f.logs.String())

	// The new store is watched.
	writeFile(t, filepath.Join(other, "http.yaml"), "id: http\nname: h\ndescription: d\nvalue: {port: 4}\n")
	poll.WaitOn(t, valueIs(f, "http", `{"port":4}`))
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	assert.NilError(t, os.WriteFile(path, []byte(content), 0o644))
}

func valueIs(f *fixture, id, want string) poll.Check {
	return func(poll.LogT) poll.Result {
		v, err := f.w.Get(context.Background(), id, true)
		if err != nil {
			return poll.Continue("get %s: %v", id, err)
		}
		if string(v) != want {
			return poll.Continue("%s is %s, want %s", id, v, want)
		}
		return poll.Success()
	}
}

func logContains(f *fixture, s string, times int) poll.Check {
	return func(poll.LogT) poll.Result {
		if n := strings.Count(f.logs.String(), s); n < times {
			return poll.Continue("log has %q %d times, want %d", s, n, times)
		}
		return poll.Success()
	}
}

func TestHandEdits(t *testing.T) {
	ctx := context.Background()
	f := newWorker(t, env{"P": "70000"})
	f.register(t, "http", portSchema, `{"port": 8080}`)
	path := filepath.Join(f.dir, "http.yaml")

	// A valid edit is picked up.
	writeFile(t, path, "id: http\nname: HTTP\ndescription: edited\nvalue:\n  port: 8081\n")
	poll.WaitOn(t, valueIs(f, "http", `{"port":8081}`))
	assert.Equal(t, strings.Count(f.logs.String(), "configuration file edit applied"), 1,
		"the worker's own write at registration is not reported as an edit")

	// An edit that breaks the schema is refused; the old value stays.
	writeFile(t, path, "id: http\nname: HTTP\ndescription: edited\nvalue:\n  port: not-a-port\n")
	poll.WaitOn(t, logContains(f, "does not match the schema", 1))
	assert.Equal(t, f.get(t, "http", true), `{"port":8081}`)
	assert.Assert(t, strings.Contains(f.logs.String(), `at /port: got string, want integer`), f.logs.String())

	// So is one whose expansion breaks it.
	writeFile(t, path, "id: http\nname: HTTP\ndescription: edited\nvalue:\n  port: ${P}\n")
	poll.WaitOn(t, logContains(f, "does not match the schema", 2))
	assert.Equal(t, f.get(t, "http", true), `{"port":8081}`)

	// And one that is not YAML.
	writeFile(t, path, "id: http\nvalue: [\n")
	poll.WaitOn(t, logContains(f, "configuration file edit rejected; keeping the old value", 1))
	assert.Equal(t, f.get(t, "http", true), `{"port":8081}`)

	// A template is accepted as written and expanded on read.
	writeFile(t, path, "id: http\nname: HTTP\ndescription: edited\nvalue:\n  port: ${Q:8082}\n")
	poll.WaitOn(t, valueIs(f, "http", `{"port":"${Q:8082}"}`))
	assert.Equal(t, f.get(t, "http", false), `{"port":8082}`)

	// Set after edits still works and is not reported as an edit.
	_, _, err := f.w.Set(ctx, "http", json.RawMessage(`{"port":8083}`))
	assert.NilError(t, err)
	writeFile(t, path, "id: http\nname: HTTP\ndescription: edited\nvalue:\n  port: 8084\n")
	poll.WaitOn(t, valueIs(f, "http", `{"port":8084}`))
	assert.Equal(t, strings.Count(f.logs.String(), "configuration file edit applied"), 3)

	// A new file for an unregistered id is loaded without a schema.
	writeFile(t, filepath.Join(f.dir, "extra.yaml"), "id: extra\nname: Extra\ndescription: by hand\nvalue: [1, 2]\n")
	poll.WaitOn(t, valueIs(f, "extra", `[1,2]`))
	s := f.w.List(ctx)
	assert.Equal(t, len(s), 2)
	assert.Equal(t, s[0].Name, "Extra")

	// Deleting a file removes the value.
	assert.NilError(t, os.Remove(path))
	poll.WaitOn(t, valueIs(f, "http", `null`))
	assert.NilError(t, os.Remove(filepath.Join(f.dir, "extra.yaml")))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := f.w.Get(ctx, "extra", true); err == nil {
			return poll.Continue("extra still there")
		}
		return poll.Success()
	})
}

// TestHandlers drives the six functions the way the engine calls them.
func TestHandlers(t *testing.T) {
	f := newWorker(t, env{"PORT": "4000"})
	fns := map[string]engine.Handler{}
	for _, fn := range f.w.Functions() {
		fns[fn.Def.ID] = fn.Handler
		// Every definition carries both schemas, and they compile.
		_, err := compileSchema("req", fn.Def.RequestSchema)
		assert.NilError(t, err, fn.Def.ID)
		_, err = compileSchema("resp", fn.Def.ResponseSchema)
		assert.NilError(t, err, fn.Def.ID)
	}
	assert.Equal(t, len(fns), 6)
	// The engine calls them for the engine token's holder (CallerAdmin),
	// as here, or for any other caller.
	callAs := func(admin bool, fn, data string) (string, error) {
		out, err := fns[fn](context.Background(), &engine.Call{FunctionID: fn, Data: json.RawMessage(data), CallerAdmin: admin})
		return string(out), err
	}
	call := func(fn, data string) (string, error) { return callAs(true, fn, data) }
	out, err := call(FnRegister, `{"id":"http","name":"HTTP","description":"d","schema":`+portSchema+`,"initial_value":{"port":"${PORT:1}"},"_caller_worker_id":"w1"}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"id":"http","name":"HTTP","description":"d","schema":`+portSchema+`,"value":{"port":"${PORT:1}"}}`)
	out, err = call(FnGet, `{"id":"http"}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"id":"http","value":{"port":4000}}`)
	out, err = callAs(false, FnGet, `{"id":"http"}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"id":"http","value":{"port":"${PORT:1}"}}`, "another caller gets the stored value as written")
	out, err = call(FnGet, `{"id":"http","raw":true}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"id":"http","value":{"port":"${PORT:1}"}}`)
	out, err = call(FnSet, `{"id":"http","value":{"port":5}}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"old_value":{"port":"${PORT:1}"},"new_value":{"port":5}}`)
	out, err = call(FnEnsure, `{"id":"http","name":"HTTP","description":"d","schema":`+portSchema+`,"initial_value":{"port":6}}`)
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(out, `"value":{"port":5}`), out)
	out, err = call(FnList, ``)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"configurations":[{"id":"http","name":"HTTP","description":"d","schema":`+portSchema+`}]}`)
	out, err = call(FnList, `{}`)
	assert.NilError(t, err)
	out2, err := call(FnSchema, `{"id":"http"}`)
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(out, out2), "%s in %s", out2, out)

	for _, tc := range []struct{ fn, data, code string }{
		{FnGet, `[]`, CodeInvalidRequest},
		{FnGet, ``, CodeInvalidRequest},
		{FnGet, `{"id":5}`, CodeInvalidRequest},
		{FnGet, `{}`, CodeInvalidID},
		{FnSet, `{"id":"http"}`, CodeInvalidRequest},
		{FnSet, `{"id":"http","value":{"port":0}}`, CodeSchemaInvalid},
		{FnRegister, `{"schema":{}}`, CodeInvalidID},
		{FnRegister, `{"id":"x","schema":{},"name":7}`, CodeInvalidRequest},
		{FnList, `"x"`, CodeInvalidRequest},
		{FnSchema, `{"id":"missing"}`, CodeNotFound},
	} {
		_, err := call(tc.fn, tc.data)
		assertCode(t, err, tc.code)
	}
}

// Entry files may hold secrets (a redis_url's password): only their owner
// may read them.
func TestFSStoreFilesArePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "configuration")
	st := NewFSStore(FSOptions{Dir: dir})
	ctx := context.Background()
	assert.NilError(t, st.Put(ctx, StoredEntry{ID: "secret", Value: json.RawMessage(`{"redis_url":"redis://:pw@127.0.0.1:6379"}`)}))
	fi, err := os.Stat(filepath.Join(dir, "secret.yaml"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o600))
	di, err := os.Stat(dir)
	assert.NilError(t, err)
	assert.Equal(t, di.Mode().Perm(), os.FileMode(0o700))
}
