package stream

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

func codeOf(t *testing.T, err error) string {
	t.Helper()
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "%v is not an ErrorBody", err)
	return eb.Code
}

func openMem(t *testing.T, l Limits) *Store {
	t.Helper()
	s, err := OpenStore("", 0, l)
	assert.NilError(t, err)
	return s
}

func TestStoreOperations(t *testing.T) {
	s := openMem(t, Limits{})
	old, stored, err := s.Set(t.Context(), "chat", "room-1", "m1", json.RawMessage(` { "text" : "hi" } `))
	assert.NilError(t, err)
	assert.Assert(t, old == nil, "created")
	assert.Equal(t, string(stored), `{"text":"hi"}`, "stored compact")

	old, _, err = s.Set(t.Context(), "chat", "room-1", "m1", json.RawMessage(`{"text":"hello"}`))
	assert.NilError(t, err)
	assert.Equal(t, string(old), `{"text":"hi"}`)
	_, _, err = s.Set(t.Context(), "chat", "room-1", "m0", json.RawMessage(`0`))
	assert.NilError(t, err)
	_, _, err = s.Set(t.Context(), "chat", "room-2", "m1", json.RawMessage(`null`))
	assert.NilError(t, err)
	_, _, err = s.Set(t.Context(), "audit", "a", "x", json.RawMessage(`[1,2]`))
	assert.NilError(t, err)

	v, err := s.Get(t.Context(), "chat", "room-1", "m1")
	assert.NilError(t, err)
	assert.Equal(t, string(v), `{"text":"hello"}`)
	v, err = s.Get(t.Context(), "chat", "room-1", "nope")
	assert.NilError(t, err)
	assert.Assert(t, v == nil)

	list, err := s.List(t.Context(), "chat", "room-1")
	assert.NilError(t, err)
	assert.DeepEqual(t, list, []json.RawMessage{json.RawMessage(`{"text":"hello"}`), json.RawMessage(`0`)}) // insertion order
	empty, err := s.List(t.Context(), "chat", "none")
	assert.NilError(t, err)
	assert.Equal(t, len(empty), 0)
	assert.Assert(t, empty != nil, "[] not null")

	groups, err := s.Groups(t.Context(), "chat")
	assert.NilError(t, err)
	assert.DeepEqual(t, groups, []string{"room-1", "room-2"})
	assert.DeepEqual(t, all(t, s), []Meta{{ID: "audit", Groups: []string{"a"}}, {ID: "chat", Groups: []string{"room-1", "room-2"}}})

	old, err = s.Delete(t.Context(), "chat", "room-2", "m1")
	assert.NilError(t, err)
	assert.Equal(t, string(old), "null")
	old, err = s.Delete(t.Context(), "chat", "room-2", "m1")
	assert.NilError(t, err)
	assert.Assert(t, old == nil, "nothing left to delete")
	groups, _ = s.Groups(t.Context(), "chat")
	assert.DeepEqual(t, groups, []string{"room-1"}) // an emptied group goes

	// Deleting everything gives the bytes back.
	for _, k := range [][3]string{{"chat", "room-1", "m1"}, {"chat", "room-1", "m0"}, {"audit", "a", "x"}} {
		_, err := s.Delete(t.Context(), k[0], k[1], k[2])
		assert.NilError(t, err)
	}
	assert.Equal(t, s.bytes, int64(0))
	assert.DeepEqual(t, all(t, s), []Meta{})
}

func TestStoreLimits(t *testing.T) {
	s := openMem(t, Limits{IDBytes: 8, ValueBytes: 32, StoreBytes: 600})
	tests := []struct {
		name                string
		stream, group, item string
		value               string
		code                string
	}{
		{name: "empty stream", stream: "", group: "g", item: "i", value: `1`, code: CodeInvalidInput},
		{name: "empty item", stream: "s", group: "g", item: "", value: `1`, code: CodeInvalidInput},
		{name: "long group", stream: "s", group: "ggggggggg", item: "i", value: `1`, code: CodeInvalidInput},
		{name: "not utf8", stream: "s\xff", group: "g", item: "i", value: `1`, code: CodeInvalidInput},
		{name: "not json", stream: "s", group: "g", item: "i", value: `{`, code: CodeInvalidInput},
		{name: "value too large", stream: "s", group: "g", item: "i", value: `"` + strings.Repeat("x", 40) + `"`, code: CodeValueTooLarge},
		{name: "value huge", stream: "s", group: "g", item: "i", value: `"` + strings.Repeat("x", 4000) + `"`, code: CodeValueTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := s.Set(t.Context(), tc.stream, tc.group, tc.item, json.RawMessage(tc.value))
			assert.Equal(t, codeOf(t, err), tc.code)
		})
	}
	// The store fills up: each item costs its ids, value and overhead.
	var err error
	n := 0
	for n = 0; n < 100; n++ {
		if _, _, err = s.Set(t.Context(), "s", "g", string(rune('a'+n)), json.RawMessage(`"0123456789"`)); err != nil {
			break
		}
	}
	assert.Equal(t, codeOf(t, err), CodeStoreFull)
	assert.Assert(t, n > 2 && n < 10, "%d items fit", n)
	assert.Assert(t, s.bytes <= 600)
	// Overwriting with the same size still fits; deleting makes room.
	_, _, err = s.Set(t.Context(), "s", "g", "a", json.RawMessage(`"9876543210"`))
	assert.NilError(t, err)
	_, err = s.Delete(t.Context(), "s", "g", "a")
	assert.NilError(t, err)
	_, _, err = s.Set(t.Context(), "s", "g", "new", json.RawMessage(`"0123456789"`))
	assert.NilError(t, err)
}

func TestStorePersists(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "streams")
	s, err := OpenStore(dir, time.Hour, Limits{})
	assert.NilError(t, err)
	_, _, err = s.Set(t.Context(), "chat", "room-1", "b", json.RawMessage(`{"n":1}`))
	assert.NilError(t, err)
	_, _, err = s.Set(t.Context(), "chat", "room-1", "a", json.RawMessage(`"x"`))
	assert.NilError(t, err)
	_, _, _, err = s.Update(t.Context(), "counters", "g", "c", []UpdateOp{{Type: "increment", Path: []string{"n"}, By: 5}})
	assert.NilError(t, err)
	assert.NilError(t, s.Close())

	info, err := os.Stat(filepath.Join(dir, storeFile))
	assert.NilError(t, err)
	assert.Equal(t, info.Mode().Perm(), os.FileMode(0o600))
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*.tmp"))
	assert.Equal(t, len(leftovers), 0, "no temporary file left")

	s2, err := OpenStore(dir, 0, Limits{})
	assert.NilError(t, err)
	list, err := s2.List(t.Context(), "chat", "room-1")
	assert.NilError(t, err)
	assert.DeepEqual(t, list, []json.RawMessage{json.RawMessage(`{"n":1}`), json.RawMessage(`"x"`)})
	v, err := s2.Get(t.Context(), "counters", "g", "c")
	assert.NilError(t, err)
	assert.Equal(t, string(v), `{"n":5}`)
	assert.Equal(t, s2.bytes, s.bytes, "the account is rebuilt")
	assert.NilError(t, s2.Close())
}

func TestStoreSaveLoop(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir, 20*time.Millisecond, Limits{})
	assert.NilError(t, err)
	defer s.Close()
	_, _, err = s.Set(t.Context(), "s", "g", "i", json.RawMessage(`1`))
	assert.NilError(t, err)
	deadline := time.Now().Add(5 * time.Second)
	for {
		data, err := os.ReadFile(filepath.Join(dir, storeFile))
		if err == nil && strings.Contains(string(data), `"value":1`) {
			break
		}
		assert.Assert(t, time.Now().Before(deadline), "the save loop never wrote the store")
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStoreRefusesCorruptFile(t *testing.T) {
	tests := []struct{ name, content, want string }{
		{name: "not json", content: "{", want: "not a stream store file"},
		{name: "version", content: `{"version":9,"streams":[]}`, want: "version 9"},
		{name: "bad id", content: `{"version":1,"streams":[{"name":"","groups":[{"id":"g","items":[{"id":"i","value":1}]}]}]}`, want: "stream_name is empty"},
		{name: "bad value", content: `{"version":1,"streams":[{"name":"s","groups":[{"id":"g","items":[{"id":"i","value":"` + strings.Repeat("x", 100) + `"}]}]}]}`, want: "at most 64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			assert.NilError(t, os.WriteFile(filepath.Join(dir, storeFile), []byte(tc.content), 0o600))
			_, err := OpenStore(dir, 0, Limits{ValueBytes: 64})
			assert.Equal(t, codeOf(t, err), CodeStoreCorrupt)
			assert.Assert(t, is.Contains(err.Error(), tc.want))
			data, _ := os.ReadFile(filepath.Join(dir, storeFile))
			assert.Equal(t, string(data), tc.content, "the file is left as it was")
		})
	}
}

func all(t *testing.T, s *Store) []Meta {
	t.Helper()
	m, err := s.All(t.Context())
	assert.NilError(t, err)
	return m
}
