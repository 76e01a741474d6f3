package queue

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeRecord: any bytes decode to a record, ErrShortRecord or
// ErrCorruptRecord, never a panic; a record decoded encodes back to one
// that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	m := msg("a", 1)
	for _, r := range []*record{{Op: opPut, Msg: &m}, {Op: opAck, ID: "a"}, {Op: opDLQ, Entry: &DLQEntry{Job: m}}} {
		b, _ := encodeRecord(r)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, '{'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := decodeRecord(b)
		if err != nil {
			if !errors.Is(err, ErrShortRecord) && !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if n < recordHeader || n > len(b) || !r.valid() {
			t.Fatalf("decoded %d of %d bytes into %+v", n, len(b), r)
		}
		again, err := encodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, _, err := decodeRecord(again)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := json.Marshal(r)
		y, _ := json.Marshal(r2)
		if string(x) != string(y) {
			t.Fatalf("%s != %s", x, y)
		}
	})
}

// FuzzParseSubscriber: a trigger config is accepted or refused with
// INVALID_CONFIG, never a panic; an accepted one names a queue.
func FuzzParseSubscriber(f *testing.F) {
	f.Add(`{"queue":"q","queue_config":{"type":"fifo","concurrency":2}}`)
	f.Add(`{"topic":""}`)
	f.Add(`{"queue":"q","max_retries":1e99}`)
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseSubscriber(json.RawMessage(s))
		if err == nil && c.Queue == "" {
			t.Fatalf("accepted %q without a queue", s)
		}
	})
}
