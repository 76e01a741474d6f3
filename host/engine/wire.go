package engine

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/iii-sandbox/iii/protocol"
)

// The two frames on the call path are written by hand: the payloads are
// already-valid JSON taken from the inbound frame and are copied as bytes,
// never re-encoded (encoding/json would re-validate and compact them).

func appendInvokeFrame(b []byte, invocationID, functionID string, data, metadata json.RawMessage, traceparent, baggage string) []byte {
	if b == nil {
		b = make([]byte, 0, 96+len(functionID)+len(data)+len(metadata)+len(traceparent)+len(baggage))
	}
	b = append(b, `{"type":"invokefunction"`...)
	if invocationID != "" {
		b = append(b, `,"invocation_id":`...)
		b = appendString(b, invocationID)
	}
	b = append(b, `,"function_id":`...)
	b = appendString(b, functionID)
	if len(data) > 0 {
		b = append(b, `,"data":`...)
		b = append(b, data...)
	}
	if traceparent != "" {
		b = append(b, `,"traceparent":`...)
		b = appendString(b, traceparent)
	}
	if baggage != "" {
		b = append(b, `,"baggage":`...)
		b = appendString(b, baggage)
	}
	if len(metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = append(b, metadata...)
	}
	return append(b, '}')
}

func appendResultFrame(b []byte, invocationID, functionID string, result json.RawMessage, errb *protocol.ErrorBody, traceparent, baggage string) []byte {
	if b == nil {
		n := 96 + len(invocationID) + len(functionID) + len(result) + len(traceparent) + len(baggage)
		if errb != nil {
			n += len(errb.Message) + len(errb.Code) + len(errb.Stacktrace) + 40
		}
		b = make([]byte, 0, n)
	}
	b = append(b, `{"type":"invocationresult","invocation_id":`...)
	b = appendString(b, invocationID)
	b = append(b, `,"function_id":`...)
	b = appendString(b, functionID)
	if errb != nil {
		b = append(b, `,"error":{"code":`...)
		b = appendString(b, errb.Code)
		b = append(b, `,"message":`...)
		b = appendString(b, errb.Message)
		if errb.Stacktrace != "" {
			b = append(b, `,"stacktrace":`...)
			b = appendString(b, errb.Stacktrace)
		}
		b = append(b, '}')
	} else if len(result) > 0 {
		b = append(b, `,"result":`...)
		b = append(b, result...)
	}
	if traceparent != "" {
		b = append(b, `,"traceparent":`...)
		b = appendString(b, traceparent)
	}
	if baggage != "" {
		b = append(b, `,"baggage":`...)
		b = appendString(b, baggage)
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string. Invalid UTF-8 becomes U+FFFD, as
// encoding/json does, so the frame stays valid for every peer.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			// Valid JSON, but not valid JavaScript source; escape as
			// encoding/json does.
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// injectCaller adds "_caller_worker_id" to an object payload by splicing
// bytes (the payload is not re-encoded). The key goes last so it overrides
// any value the caller put there itself: JSON parsers keep the last
// duplicate, and a worker must not be able to speak as another.
func injectCaller(data json.RawMessage, workerID string) json.RawMessage {
	d := bytes.TrimSpace(data)
	if len(d) < 2 || d[0] != '{' || d[len(d)-1] != '}' {
		return data
	}
	empty := len(bytes.TrimSpace(d[1:len(d)-1])) == 0
	out := make([]byte, 0, len(d)+len(workerID)+24)
	out = append(out, d[:len(d)-1]...)
	if !empty {
		out = append(out, ',')
	}
	out = append(out, `"_caller_worker_id":`...)
	out = appendString(out, workerID)
	return append(out, '}')
}

// resultSender answers socket caller a's invocation id of function fid
// with a result frame. It sends nothing for a void call (id "") or once a
// is closing.
func resultSender(a *worker, id, fid, traceparent, baggage string) func(json.RawMessage, *protocol.ErrorBody) {
	return func(res json.RawMessage, errb *protocol.ErrorBody) {
		if id != "" && !a.closing.Load() {
			a.conn.send(appendResultFrame(nil, id, fid, res, errb, traceparent, baggage))
		}
	}
}

// engineStopping is the answer to a call the engine can no longer start.
func engineStopping() *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: protocol.CodeInvocationStopped, Message: "engine stopping"}
}
