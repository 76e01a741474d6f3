package queue

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/redisserver"
)

func msg(id string, seq uint64) Message {
	return Message{ID: id, Seq: seq, Queue: "q", FunctionID: "f", Data: json.RawMessage(`{"n":1}`), MaxAttempts: 3, BackoffMS: 10,
		CreatedAt: time.Unix(1, 0).UTC()}
}

// What the store was told survives a reopen: pending messages (with
// their attempts), dead letters, subscriptions and defined queues; acked
// and discarded ones do not.
func TestStoreReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	assert.NilError(t, err)
	assert.NilError(t, s.PutAll([]Message{msg("a", 1), msg("b", 2), msg("c", 3)}))
	assert.NilError(t, s.Ack("a"))
	b := msg("b", 2)
	b.Attempts = 2
	assert.NilError(t, s.Put(b))
	assert.NilError(t, s.ToDLQ(DLQEntry{Job: msg("c", 3), Error: "boom", FailedAt: time.Unix(2, 0).UTC()}))
	assert.NilError(t, s.PutAll([]Message{msg("d", 4)}))
	assert.NilError(t, s.ToDLQ(DLQEntry{Job: msg("d", 4), Error: "boom"}))
	assert.NilError(t, s.Discard("d"))
	assert.NilError(t, s.PutSub(Subscription{ID: "s1", Topic: "t", Config: SubscriberConfig{Queue: "t", MaxRetries: 1}}))
	cfg, err := ParseQueueConfig(json.RawMessage(`{"concurrency":3}`))
	assert.NilError(t, err)
	assert.NilError(t, s.Define("jobs", cfg))

	// A second worker cannot open the same directory.
	_, err = OpenStore(dir)
	assert.Check(t, is.ErrorContains(err, "another queue worker"))
	assert.NilError(t, s.Close())

	s, err = OpenStore(dir)
	assert.NilError(t, err)
	defer s.Close()
	assert.Check(t, is.Equal(s.Recovered, ""))
	p := s.Pending()
	assert.Assert(t, is.Len(p, 1))
	assert.Check(t, is.Equal(p[0].ID, "b"))
	assert.Check(t, is.Equal(p[0].Attempts, 2))
	dlq := s.DLQ("q")
	assert.Assert(t, is.Len(dlq, 1))
	assert.Check(t, is.Equal(dlq[0].Error, "boom"))
	assert.Check(t, is.Len(s.Subs(), 1))
	assert.Check(t, is.Equal(*s.Defs()["jobs"].Concurrency, 3))
	assert.Check(t, s.NextSeq() > 4)
}

// A record torn by a crash is dropped, and everything before it kept; a
// corrupt one is set aside in a file of its own.
func TestStoreTornAndCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		damage  func([]byte) []byte
		aside   bool
		pending int
	}{
		{"torn tail", func(b []byte) []byte { return b[:len(b)-3] }, false, 1},
		{"flipped byte in the last record", func(b []byte) []byte { b[len(b)-2] ^= 0xff; return b }, true, 1},
		{"garbage appended", func(b []byte) []byte { return append(b, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4, 5) }, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenStore(dir)
			assert.NilError(t, err)
			assert.NilError(t, s.Put(msg("a", 1)))
			assert.NilError(t, s.Put(msg("b", 2)))
			assert.NilError(t, s.Close())
			path := filepath.Join(dir, logName)
			b, err := os.ReadFile(path)
			assert.NilError(t, err)
			assert.NilError(t, os.WriteFile(path, tc.damage(b), 0o600))
			s, err = OpenStore(dir)
			assert.NilError(t, err)
			defer s.Close()
			assert.Check(t, s.Recovered != "")
			assert.Check(t, is.Len(s.Pending(), tc.pending))
			asides, _ := filepath.Glob(filepath.Join(dir, logName+".corrupt-*"))
			assert.Check(t, is.Equal(len(asides) == 1, tc.aside))
		})
	}
}

// The log is compacted once it is several times what it holds.
func TestStoreCompacts(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	assert.NilError(t, err)
	defer s.Close()
	data := make([]byte, 64<<10)
	for i := range data {
		data[i] = 'x'
	}
	big := json.RawMessage(`"` + string(data) + `"`)
	for i := range 200 {
		m := msg("m", uint64(i+1))
		m.Data = big
		assert.NilError(t, s.Put(m))
		assert.NilError(t, s.Ack("m"))
	}
	st, err := os.Stat(filepath.Join(dir, logName))
	assert.NilError(t, err)
	assert.Check(t, st.Size() < 200*64<<10/2, "the log holds %d bytes", st.Size())
}

func TestRecordRoundTrip(t *testing.T) {
	m := msg("a", 1)
	for _, r := range []*record{
		{Op: opPut, Msg: &m}, {Op: opAck, ID: "a"}, {Op: opUndlq, ID: "a"}, {Op: opUnsub, ID: "s"},
		{Op: opDLQ, Entry: &DLQEntry{Job: m, Error: "e"}}, {Op: opSub, Sub: &Subscription{ID: "s", Topic: "t"}},
	} {
		b, err := encodeRecord(r)
		assert.NilError(t, err)
		got, n, err := decodeRecord(b)
		assert.NilError(t, err)
		assert.Check(t, is.Equal(n, len(b)))
		assert.Check(t, is.Equal(got.Op, r.Op))
		_, _, err = decodeRecord(b[:len(b)-1])
		assert.Check(t, is.ErrorIs(err, ErrShortRecord))
	}
	_, _, err := decodeRecord([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	assert.Check(t, is.ErrorIs(err, ErrCorruptRecord))
	b, _ := encodeRecord(&record{Op: "what"})
	_, _, err = decodeRecord(b)
	assert.Check(t, is.ErrorIs(err, ErrCorruptRecord))
}

// The redis adapter keeps the same log in a Redis list: what it was told
// survives a reopen, a second worker on the same prefix waits for the
// lock (and is refused past lockWait), another prefix is another queue.
func TestRedisStore(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	s, err := OpenRedisStore(ctx, srv.URL, "t1:")
	assert.NilError(t, err)
	assert.NilError(t, s.PutAll([]Message{msg("a", 1), msg("b", 2)}))
	assert.NilError(t, s.Ack("a"))
	assert.NilError(t, s.ToDLQ(DLQEntry{Job: msg("c", 3), Error: "boom"}))

	other, err := OpenRedisStore(ctx, srv.URL, "t2:")
	assert.NilError(t, err)
	assert.Check(t, is.Len(other.Pending(), 0))
	assert.NilError(t, other.Close())

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = OpenRedisStore(short, srv.URL, "t1:")
	assert.Check(t, err != nil, "a second worker opened a held log")
	assert.NilError(t, s.Close())

	s, err = OpenRedisStore(ctx, srv.URL, "t1:")
	assert.NilError(t, err)
	defer s.Close()
	p := s.Pending()
	assert.Assert(t, is.Len(p, 1))
	assert.Check(t, is.Equal(p[0].ID, "b"))
	assert.Check(t, is.Len(s.DLQ("q"), 1))

	_, err = OpenRedisStore(ctx, "redis://127.0.0.1:1", "x:")
	assert.Check(t, is.Equal(code(t, err), CodeStoreUnavailable))
}
