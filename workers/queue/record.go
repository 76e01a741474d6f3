package queue

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
)

// The store's log is a sequence of records, each
//
//	uint32 LE  length of the payload
//	uint32 LE  CRC-32C of the payload
//	payload    one JSON object (a record)
//
// A crash can leave a torn record at the end: the decoder says
// ErrShortRecord and the store truncates the log there. A record whose
// checksum or JSON is wrong is ErrCorruptRecord.

// maxRecordSize bounds one record (a message's data is bounded by the
// engine's frame limit, well under it).
const maxRecordSize = 64 << 20

const recordHeader = 8

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// ErrShortRecord: the bytes end inside a record (a torn write).
var ErrShortRecord = errors.New("queue store: the log ends inside a record")

// ErrCorruptRecord: a record's length, checksum or content is wrong.
var ErrCorruptRecord = errors.New("queue store: corrupt record")

// Record operations.
const (
	opPut    = "put"    // a pending message, new or updated
	opAck    = "ack"    // the message is done
	opDLQ    = "dlq"    // the message moved to its queue's DLQ
	opUndlq  = "undlq"  // a DLQ entry removed (redriven or discarded)
	opSub    = "sub"    // a subscription, new or updated
	opUnsub  = "unsub"  // a subscription removed
	opDefine = "define" // a function queue defined with queue::define
)

// record is one entry of the log.
type record struct {
	Op    string        `json:"op"`
	ID    string        `json:"id,omitempty"`
	Msg   *Message      `json:"msg,omitempty"`
	Entry *DLQEntry     `json:"entry,omitempty"`
	Sub   *Subscription `json:"sub,omitempty"`
	Queue string        `json:"queue,omitempty"`
	Def   *QueueConfig  `json:"def,omitempty"`
}

// Message is one delivery to make: to a subscription of a topic, or an
// enqueued call of a function. Its JSON is upstream's job shape.
type Message struct {
	ID          string          `json:"id"`
	Seq         uint64          `json:"seq"`
	Queue       string          `json:"queue"`
	Sub         string          `json:"subscription,omitempty"` // topic messages
	FunctionID  string          `json:"function_id,omitempty"`  // enqueued calls
	Namespace   string          `json:"namespace,omitempty"`
	Data        json.RawMessage `json:"data"`
	Attempts    int             `json:"attempts_made"`
	MaxAttempts int             `json:"max_attempts"`
	BackoffMS   int64           `json:"backoff_delay_ms"`
	CreatedAt   time.Time       `json:"created_at"`
	ProcessAt   time.Time       `json:"process_at,omitzero"`
	GroupID     string          `json:"group_id,omitempty"`
	ReceiptID   string          `json:"message_id,omitempty"`
	Traceparent string          `json:"traceparent,omitempty"`
	Baggage     string          `json:"baggage,omitempty"`
	LastError   string          `json:"last_error,omitempty"`
}

// DLQEntry is a message that exhausted its attempts.
type DLQEntry struct {
	Job      Message   `json:"job"`
	Error    string    `json:"error"`
	FailedAt time.Time `json:"failed_at"`
}

// Subscription is who receives a topic's messages: a trigger, or a
// consumer group of triggers.
type Subscription struct {
	ID     string           `json:"id"`
	Topic  string           `json:"topic"`
	Config SubscriberConfig `json:"config"`
	// Seen is when a trigger of it was last registered or unregistered.
	Seen time.Time `json:"seen"`
}

func (r *record) valid() bool {
	switch r.Op {
	case opPut:
		return r.Msg != nil && r.Msg.ID != "" && r.Msg.Queue != ""
	case opDLQ:
		return r.Entry != nil && r.Entry.Job.ID != "" && r.Entry.Job.Queue != ""
	case opAck, opUndlq, opUnsub:
		return r.ID != ""
	case opSub:
		return r.Sub != nil && r.Sub.ID != "" && r.Sub.Topic != ""
	case opDefine:
		return r.Queue != "" && r.Def != nil
	}
	return false
}

// encodeRecord frames r.
func encodeRecord(r *record) ([]byte, error) {
	payload, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode a %s record: %w", r.Op, err)
	}
	if len(payload) > maxRecordSize {
		return nil, fmt.Errorf("a %s record of %d bytes is over the %d-byte limit", r.Op, len(payload), maxRecordSize)
	}
	out := make([]byte, recordHeader+len(payload))
	binary.LittleEndian.PutUint32(out[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(out[4:8], crc32.Checksum(payload, crcTable))
	copy(out[recordHeader:], payload)
	return out, nil
}

// decodeRecord reads the record at the start of b and how many bytes it
// took.
func decodeRecord(b []byte) (*record, int, error) {
	if len(b) < recordHeader {
		return nil, 0, ErrShortRecord
	}
	n := binary.LittleEndian.Uint32(b[0:4])
	if n == 0 || n > maxRecordSize {
		return nil, 0, fmt.Errorf("%w: length %d", ErrCorruptRecord, n)
	}
	if uint64(len(b)-recordHeader) < uint64(n) {
		return nil, 0, ErrShortRecord
	}
	payload := b[recordHeader : recordHeader+int(n)]
	if crc32.Checksum(payload, crcTable) != binary.LittleEndian.Uint32(b[4:8]) {
		return nil, 0, fmt.Errorf("%w: checksum mismatch", ErrCorruptRecord)
	}
	var r record
	if err := json.Unmarshal(payload, &r); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrCorruptRecord, err)
	}
	if !r.valid() {
		return nil, 0, fmt.Errorf("%w: an incomplete %q record", ErrCorruptRecord, clip(r.Op))
	}
	return &r, recordHeader + int(n), nil
}
