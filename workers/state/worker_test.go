package state

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/redisserver"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newWorker(t *testing.T, cfg string, inv Invoker) *Worker {
	t.Helper()
	c, err := ParseConfig(json.RawMessage(cfg))
	assert.NilError(t, err)
	w, err := New(context.Background(), c, Options{BaseDir: t.TempDir(), Invoker: inv})
	assert.NilError(t, err)
	t.Cleanup(func() { assert.NilError(t, w.Close(context.Background())) })
	return w
}

// do calls one of the worker's functions by id and returns its answer as
// compact JSON.
func do(t *testing.T, w *Worker, fn, req string) (string, error) {
	t.Helper()
	for _, f := range w.functions() {
		if f.id == fn {
			out, err := f.h(context.Background(), json.RawMessage(req))
			if err != nil {
				return "", err
			}
			b, err := json.Marshal(out)
			assert.NilError(t, err)
			return string(b), nil
		}
	}
	t.Fatalf("no function %s", fn)
	return "", nil
}

func mustDo(t *testing.T, w *Worker, fn, req string) string {
	t.Helper()
	out, err := do(t, w, fn, req)
	assert.NilError(t, err, "%s %s", fn, req)
	return out
}

// backends runs f against every adapter: kv in memory, kv file_based, and
// redis on a redis-server of the test's own.
func backends(t *testing.T, f func(t *testing.T, cfg string)) {
	t.Run("kv in_memory", func(t *testing.T) { f(t, `{"adapter":{"name":"kv","config":{"store_method":"in_memory"}}}`) })
	t.Run("kv file_based", func(t *testing.T) {
		f(t, `{"adapter":{"name":"kv","config":{"store_method":"file_based","file_path":"`+t.TempDir()+`"}}}`)
	})
	t.Run("redis", func(t *testing.T) {
		r := redisserver.Start(t)
		f(t, `{"adapter":{"name":"redis","config":{"redis_url":"`+r.URL+`"}}}`)
	})
}

func TestFunctions(t *testing.T) {
	backends(t, func(t *testing.T, cfg string) {
		w := newWorker(t, cfg, nil)
		steps := []struct{ fn, req, want string }{
			{FnGet, `{"scope":"users","key":"u1"}`, `null`},
			{FnSet, `{"scope":"users","key":"u1","value":{"name":"Alice"}}`, `{"old_value":null,"new_value":{"name":"Alice"}}`},
			{FnSet, `{"scope":"users","key":"u1","data":{"name":"Bob"},"_caller_worker_id":"x"}`, `{"old_value":{"name":"Alice"},"new_value":{"name":"Bob"}}`},
			{FnGet, `{"scope":"users","key":"u1"}`, `{"name":"Bob"}`},
			{FnSet, `{"scope":"users","key":"u0","value":null}`, `{"old_value":null,"new_value":null}`},
			{FnSet, `{"scope":"orders","key":"o1","value":  [1, 2]}`, `{"old_value":null,"new_value":[1,2]}`},
			{FnList, `{"scope":"users"}`, `[null,{"name":"Bob"}]`},
			{FnList, `{"scope":"nobody"}`, `[]`},
			{FnListKeys, `{"scope":"users"}`, `{"keys":["u0","u1"]}`},
			{FnListGroups, `{}`, `{"groups":["orders","users"]}`},
			{FnUpdate, `{"scope":"c","key":"n","ops":[{"type":"increment","path":"hits","by":2}]}`, `{"new_value":{"hits":2}}`},
			{FnUpdate, `{"scope":"c","key":"n","ops":[{"type":"increment","path":"hits","by":1},{"type":"merge","value":5}]}`,
				`{"old_value":{"hits":2},"new_value":{"hits":3},"errors":[{"op_index":1,"code":"merge.value.not_an_object","message":"Merge value must be a JSON object"}]}`},
			{FnDelete, `{"scope":"users","key":"u1"}`, `{"name":"Bob"}`},
			{FnDelete, `{"scope":"users","key":"u1"}`, `null`},
			{FnDelete, `{"scope":"users","key":"u0"}`, `null`},
			{FnListGroups, `{}`, `{"groups":["c","orders"]}`},
			{FnListEntries, `{"scope":"orders"}`, `{"entries":[["o1",[1,2]]],"next_cursor":null,"done":true,"offset":0,"total":1}`},
		}
		for i, s := range steps {
			got, err := do(t, w, s.fn, s.req)
			assert.NilError(t, err, "step %d: %s %s", i, s.fn, s.req)
			assert.Equal(t, got, s.want, "step %d: %s %s", i, s.fn, s.req)
		}
	})
}

func TestErrors(t *testing.T) {
	w := newWorker(t, `{"adapter":{"name":"kv","config":{"store_method":"in_memory"}},"max_value_bytes":16}`, nil)
	tests := []struct{ name, fn, req, code, msg string }{
		{"set not an object", FnSet, `[1]`, CodeInvalidInput, "must be a JSON object"},
		{"set no scope", FnSet, `{"key":"k","value":1}`, CodeInvalidInput, "missing field `scope`"},
		{"set no key", FnSet, `{"scope":"s","value":1}`, CodeInvalidInput, "missing field `key`"},
		{"set scope not a string", FnSet, `{"scope":1,"key":"k","value":1}`, CodeInvalidInput, "cannot unmarshal"},
		{"set no value", FnSet, `{"scope":"s","key":"k"}`, CodeInvalidInput, "missing field `value`"},
		{"set too large", FnSet, `{"scope":"s","key":"k","value":"0123456789abcdef"}`, CodeValueTooLarge, "VALUE_TOO_LARGE: value of 18 bytes exceeds the configured max_value_bytes limit of 16"},
		{"get no key", FnGet, `{"scope":"s"}`, CodeInvalidInput, "missing field `key`"},
		{"delete no scope", FnDelete, `{}`, CodeInvalidInput, "missing field `scope`"},
		{"update no ops", FnUpdate, `{"scope":"s","key":"k"}`, CodeInvalidInput, "missing field `ops`"},
		{"update bad op", FnUpdate, `{"scope":"s","key":"k","ops":[{"type":"explode"}]}`, CodeInvalidInput, `unknown type "explode"`},
		{"list no scope", FnList, `{}`, CodeInvalidInput, "missing field `scope`"},
		{"list_keys no scope", FnListKeys, `null`, CodeInvalidInput, "must be a JSON object"},
		{"list_entries bad limit", FnListEntries, `{"scope":"s","limit":0}`, CodeInvalidInput, "limit 0 is outside 1..1000"},
		{"list_entries bad max_bytes", FnListEntries, `{"scope":"s","max_bytes":10}`, CodeInvalidInput, "max_bytes 10 is outside 256..8000000"},
		{"list_entries bad cursor", FnListEntries, `{"scope":"s","cursor":"nope"}`, CodeInvalidCursor, "unknown, expired"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := do(t, w, tc.fn, tc.req)
			assert.Assert(t, err != nil)
			assert.Equal(t, codeOf(t, err), tc.code)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
	// The limit guards set only (upstream: update is not size-guarded);
	// a value at the limit passes.
	mustDo(t, w, FnSet, `{"scope":"s","key":"k","value":"0123456789abcd"}`)
	mustDo(t, w, FnUpdate, `{"scope":"s","key":"u","ops":[{"type":"set","path":"","value":"0123456789abcdefghij"}]}`)
}

func TestListEntriesPages(t *testing.T) {
	w := newWorker(t, `{}`, nil)
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		mustDo(t, w, FnSet, `{"scope":"s","key":"`+k+`","value":"`+strings.Repeat(k, 100)+`"}`)
	}
	var page EntriesPage
	assert.NilError(t, json.Unmarshal([]byte(mustDo(t, w, FnListEntries, `{"scope":"s","limit":2}`)), &page))
	assert.Check(t, is.Len(page.Entries, 2))
	assert.Check(t, !page.Done && page.NextCursor != nil && page.Total == 5 && page.Offset == 0)
	// A write after the snapshot is not seen by its pages.
	mustDo(t, w, FnSet, `{"scope":"s","key":"f","value":1}`)
	cur := *page.NextCursor
	// max_bytes bounds the page: 256 bytes hold one ~100-byte row here.
	var next EntriesPage
	assert.NilError(t, json.Unmarshal([]byte(mustDo(t, w, FnListEntries, `{"scope":"s","limit":2,"max_bytes":256,"cursor":"`+cur+`"}`)), &next))
	assert.Check(t, is.Len(next.Entries, 1))
	assert.Check(t, next.Offset == 2 && next.Total == 5 && !next.Done)
	assert.Check(t, is.Contains(string(next.Entries[0]), `"c"`))
	// A cursor is single-use.
	_, err := do(t, w, FnListEntries, `{"scope":"s","cursor":"`+cur+`"}`)
	assert.Equal(t, codeOf(t, err), CodeInvalidCursor)
	// The last page.
	var last EntriesPage
	assert.NilError(t, json.Unmarshal([]byte(mustDo(t, w, FnListEntries, `{"scope":"s","cursor":"`+*next.NextCursor+`"}`)), &last))
	assert.Check(t, is.Len(last.Entries, 2), "the write after the snapshot is not in it")
	assert.Check(t, last.Done && last.NextCursor == nil && last.Offset == 3)
	// A row larger than the budget alone.
	mustDo(t, w, FnSet, `{"scope":"big","key":"k","value":"`+strings.Repeat("x", 400)+`"}`)
	_, err = do(t, w, FnListEntries, `{"scope":"big","max_bytes":256}`)
	assert.Equal(t, codeOf(t, err), CodeRowTooLarge)
	// At most 16 snapshots are open.
	for range maxSnapshots {
		mustDo(t, w, FnListEntries, `{"scope":"s","limit":1}`)
	}
	_, err = do(t, w, FnListEntries, `{"scope":"s","limit":1}`)
	assert.Equal(t, codeOf(t, err), CodeSnapshotCapacity)
	// They expire after 120 s.
	w.snaps.now = func() time.Time { return time.Now().Add(snapshotTTL + time.Second) }
	mustDo(t, w, FnListEntries, `{"scope":"s","limit":1}`)
}

func TestTriggers(t *testing.T) {
	rec := newRecorder(map[string]string{"cond:no": `false`, "cond:yes": `{"ok":1}`, "cond:null": `null`})
	w := newWorker(t, `{}`, rec)
	reg := func(id, fn, ns, cfg string) {
		t.Helper()
		assert.NilError(t, w.RegisterTrigger(context.Background(), triggerReg(id, fn, ns, cfg, `{"m":1}`)))
	}
	reg("t1", "app::orders", "shop", `{"scope":"orders"}`)
	reg("t2", "app::one", "", `{"scope":"orders","key":"o2"}`)
	reg("t3", "app::blocked", "shop", `{"condition_function_id":"cond:no"}`)
	reg("t4", "app::passed", "shop", `{"scope":"users","condition_function_id":"cond:yes"}`)
	reg("t5", "app::failedcond", "shop", `{"scope":"users","condition_function_id":"cond:missing"}`)
	reg("t6", "app::nullcond", "shop", `{"scope":"users","condition_function_id":"cond:null"}`)

	next := func() call { return waitfor.Recv(t, rec.calls, waitfor.Default, "a trigger call") }
	mustDo(t, w, FnSet, `{"scope":"orders","key":"o1","value":1}`)
	// t1 (scope orders), t3's condition (no scope filter) answering false.
	c := next()
	assert.Check(t, is.Equal(c.fn, "app::orders"))
	assert.Check(t, is.Equal(c.ns, "shop"))
	assert.Check(t, is.Equal(c.metadata, `{"m":1}`))
	assert.Check(t, is.DeepEqual(c.payload, map[string]any{"type": "state", "event_type": "state:created", "scope": "orders", "key": "o1", "old_value": nil, "new_value": 1.0}))
	assert.Check(t, is.Equal(next().fn, "cond:no"))

	mustDo(t, w, FnUpdate, `{"scope":"orders","key":"o2","ops":[{"type":"set","path":"a","value":2}]}`)
	for _, want := range []string{"app::orders", "app::one", "cond:no"} {
		c := next()
		assert.Check(t, is.Equal(c.fn, want))
		assert.Check(t, is.Equal(c.payload["event_type"], "state:created"))
	}
	assert.Check(t, is.Equal(c.ns, "shop"))

	mustDo(t, w, FnSet, `{"scope":"users","key":"u","value":2}`)
	for _, want := range []string{"cond:no", "cond:yes", "app::passed", "cond:missing", "cond:null", "app::nullcond"} {
		assert.Check(t, is.Equal(next().fn, want))
	}
	// Delete fires even for a key that is not there, with null values.
	mustDo(t, w, FnDelete, `{"scope":"orders","key":"gone"}`)
	c = next()
	assert.Check(t, is.Equal(c.fn, "app::orders"))
	assert.Check(t, is.DeepEqual(c.payload, map[string]any{"type": "state", "event_type": "state:deleted", "scope": "orders", "key": "gone", "old_value": nil, "new_value": nil}))
	assert.Check(t, is.Equal(next().fn, "cond:no"))
	mustDo(t, w, FnSet, `{"scope":"orders","key":"o1","value":3}`)
	c = next()
	assert.Check(t, is.Equal(c.payload["event_type"], "state:updated"))
	assert.Check(t, is.Equal(c.payload["old_value"], 1.0))
	assert.Check(t, is.Equal(next().fn, "cond:no"))

	// Reads fire nothing; triggers_enabled=false fires nothing; an
	// unregistered trigger is gone; a duplicate id replaces.
	mustDo(t, w, FnGet, `{"scope":"orders","key":"o1"}`)
	w.Reconfigure(Config{TriggersEnabled: new(bool)})
	mustDo(t, w, FnSet, `{"scope":"orders","key":"o1","value":4}`)
	w.Reconfigure(Config{})
	assert.NilError(t, w.UnregisterTrigger(context.Background(), triggerReg("t3", "", "", "", "")))
	reg("t1", "app::replaced", "shop", `{"scope":"orders"}`)
	mustDo(t, w, FnSet, `{"scope":"orders","key":"o1","value":5}`)
	c = next()
	assert.Check(t, is.Equal(c.fn, "app::replaced"))
	assert.Check(t, is.Equal(c.payload["new_value"], 5.0), "the event of value 4 never fired")
	select {
	case c := <-rec.calls:
		t.Fatalf("unexpected call %+v", c)
	default:
	}
	// A bad config is refused.
	err := w.RegisterTrigger(context.Background(), triggerReg("bad", "f", "", `{"scope":5}`, ""))
	assert.ErrorContains(t, err, "Failed to parse trigger config")
	err = w.RegisterTrigger(context.Background(), triggerReg("bad", "f", "", `"orders"`, ""))
	assert.ErrorContains(t, err, "Failed to parse trigger config")
}

func TestFileBasedSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := `{"adapter":{"name":"kv","config":{"store_method":"file_based","file_path":"` + dir + `"}},"save_interval_ms":100}`
	c, err := ParseConfig(json.RawMessage(cfg))
	assert.NilError(t, err)
	w, err := New(context.Background(), c, Options{})
	assert.NilError(t, err)
	mustDo(t, w, FnSet, `{"scope":"a/b ünïcode","key":"k","value":{"x":[1,2]}}`)
	mustDo(t, w, FnSet, `{"scope":"gone","key":"k","value":1}`)
	// The saver writes within the interval, without Close.
	file := scopeFile(dir, "a/b ünïcode")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := os.Stat(file); err != nil {
			return poll.Continue("%v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(20*time.Millisecond))
	mustDo(t, w, FnDelete, `{"scope":"gone","key":"k"}`)
	assert.NilError(t, w.Close(context.Background()))
	_, err = os.Stat(scopeFile(dir, "gone"))
	assert.Check(t, os.IsNotExist(err), "an emptied scope's file is removed")
	st, err := os.Stat(file)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(st.Mode().Perm(), os.FileMode(0o600)))

	w2, err := New(context.Background(), c, Options{})
	assert.NilError(t, err)
	assert.Equal(t, mustDo(t, w2, FnGet, `{"scope":"a/b ünïcode","key":"k"}`), `{"x":[1,2]}`)
	assert.Equal(t, mustDo(t, w2, FnListGroups, `{}`), `{"groups":["a/b ünïcode"]}`)
	assert.NilError(t, w2.Close(context.Background()))

	// A file that is not ours stops the start.
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "scope-00.json"), []byte("{"), 0o600))
	_, err = New(context.Background(), c, Options{})
	assert.Equal(t, codeOf(t, err), CodeStoreUnavailable)
}

func TestRelativeFilePathAndDefaults(t *testing.T) {
	c, err := ParseConfig(json.RawMessage(DefaultConfig))
	assert.NilError(t, err)
	s, err := c.Store("/proj")
	assert.NilError(t, err)
	assert.Equal(t, s.String(), "kv file_based /proj/data/state (saved every 5s)")
	c, err = ParseConfig(nil)
	assert.NilError(t, err)
	s, err = c.Store("/proj")
	assert.NilError(t, err)
	assert.Equal(t, s.String(), "kv in_memory")
	c, err = ParseConfig(json.RawMessage(`{"adapter":{"name":"redis","config":{"redis_url":"redis://u:secret@h:1"}}}`))
	assert.NilError(t, err)
	s, err = c.Store("")
	assert.NilError(t, err)
	assert.Equal(t, s.String(), "redis redis://u:xxxxx@h:1")
}

func TestParseConfig(t *testing.T) {
	tests := []struct{ name, cfg, err string }{
		{"seed", DefaultConfig, ""},
		{"all", `{"adapter":{"name":"kv","config":{"store_method":"in_memory","save_interval_ms":200}},"triggers_enabled":false,"max_value_bytes":10,"save_interval_ms":300}`, ""},
		{"out of range knobs fall back", `{"max_value_bytes":0,"save_interval_ms":5}`, ""},
		{"unknown key", `{"adapterr":{}}`, `unknown field "adapterr"`},
		{"unknown adapter", `{"adapter":{"name":"bridge"}}`, `adapter "bridge" is not one of kv, redis`},
		{"bad store method", `{"adapter":{"name":"kv","config":{"store_method":"disk"}}}`, `store_method "disk"`},
		{"unknown kv key", `{"adapter":{"name":"kv","config":{"path":"x"}}}`, `unknown field "path"`},
		{"unknown redis key", `{"adapter":{"name":"redis","config":{"url":"x"}}}`, `unknown field "url"`},
		{"wrong type", `{"max_value_bytes":"big"}`, "cannot unmarshal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(json.RawMessage(tc.cfg))
			if tc.err == "" {
				assert.NilError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.err)
			assert.Equal(t, codeOf(t, err), CodeInvalidConfig)
		})
	}
	c, err := ParseConfig(json.RawMessage(`{"max_value_bytes":0,"save_interval_ms":5}`))
	assert.NilError(t, err)
	assert.Check(t, c.ValueLimit() == 0 && c.SaveIntervalMS == nil)
}

func TestRedisUnavailable(t *testing.T) {
	c, err := ParseConfig(json.RawMessage(`{"adapter":{"name":"redis","config":{"redis_url":"redis://:pw@127.0.0.1:1"}}}`))
	assert.NilError(t, err)
	_, err = New(context.Background(), c, Options{})
	assert.Equal(t, codeOf(t, err), CodeStoreUnavailable)
	assert.Check(t, !strings.Contains(err.Error(), "pw"), "the password is not in %v", err)
}

func TestMakefileVersion(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "STATE_VERSION ?= "+Version+"\n"))
}
