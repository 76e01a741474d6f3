package engine

import (
	"encoding/binary"
	"encoding/json"
	"unicode/utf8"

	"github.com/iii-sandbox/iii/protocol"
)

// The call path (invokefunction in, invocationresult back) is most of an
// engine's traffic. Decoding those frames with encoding/json into the
// protocol's 30-field union costs more than the rest of routing together,
// and large payloads are scanned twice and copied. The fast path below reads
// only the top level of the frame, validates the whole of it, and keeps the
// payloads as spans of the frame. Anything unusual (escaped or non-ASCII
// keys, escaped ids, fields of unexpected JSON types, invalid JSON) falls
// back to protocol.Decode, so behaviour — including every error answer — is
// defined in one place.

// maxScanDepth matches encoding/json's nesting limit, so the fast path never
// accepts what the slow path would refuse.
const maxScanDepth = 10000

// hotFrame holds the top-level members of a call-path frame.
type hotFrame struct {
	typ          string
	invocationID string
	functionID   string
	traceparent  string
	baggage      string
	namespace    *string
	data         []byte // raw value; nil if absent
	result       []byte
	metadata     []byte
	action       []byte
	errorRaw     []byte
}

// fastPath handles invokefunction and invocationresult frames; handled
// false means the frame goes through protocol.Decode. handedOff is
// routeInvoke's.
func (e *Engine) fastPath(w *worker, data []byte, inPlace inPlaceRunner) (handled, handedOff bool) {
	var f hotFrame
	if !scanHotFrame(data, &f) {
		return false, false
	}
	switch f.typ {
	case string(protocol.TypeInvokeFunction):
		r := &invokeRequest{
			invocationID: f.invocationID, functionID: f.functionID, data: nonNullRaw(f.data),
			metadata: nonNullRaw(f.metadata), traceparent: f.traceparent, baggage: f.baggage, namespace: f.namespace,
		}
		if a := nonNullRaw(f.action); a != nil {
			var act protocol.TriggerAction
			if json.Unmarshal(a, &act) != nil {
				return false, false
			}
			r.action = &act
		}
		r.inPlace = inPlace
		return true, e.routeInvoke(w, r)
	case string(protocol.TypeInvocationResult):
		var errb *protocol.ErrorBody
		if er := nonNullRaw(f.errorRaw); er != nil {
			errb = new(protocol.ErrorBody)
			if json.Unmarshal(er, errb) != nil {
				return false, false
			}
		}
		e.handleResult(w, f.invocationID, f.result, errb, f.traceparent, f.baggage)
		return true, false
	}
	return false, false
}

func nonNullRaw(b []byte) []byte {
	if len(b) == 0 || (len(b) == 4 && string(b) == "null") {
		return nil
	}
	return b
}

// scanHotFrame validates data as one JSON object and fills f from its top
// level. It reports false when the frame is not a call-path frame the fast
// path can take as is.
func scanHotFrame(data []byte, f *hotFrame) bool {
	s := scanner{b: data}
	s.ws()
	if !s.consume('{') {
		return false
	}
	s.ws()
	if s.consume('}') {
		return false // no type
	}
	for {
		s.ws()
		ks, ke, plain := s.str()
		if ks < 0 || !plainKey(data[ks:ke]) || !plain {
			return false
		}
		key := data[ks:ke]
		s.ws()
		if !s.consume(':') {
			return false
		}
		s.ws()
		vs := s.i
		if !s.value(1) {
			return false
		}
		val := data[vs:s.i]
		if !f.set(key, val) {
			return false
		}
		s.ws()
		if s.consume(',') {
			continue
		}
		if s.consume('}') {
			break
		}
		return false
	}
	s.ws()
	if s.i != len(data) {
		return false
	}
	return f.typ == string(protocol.TypeInvokeFunction) || f.typ == string(protocol.TypeInvocationResult)
}

// plainKey accepts lowercase ASCII keys only: encoding/json matches keys
// case-insensitively (with Unicode folding), so anything else is left to it.
func plainKey(k []byte) bool {
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c == '_' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// set records one member. Later duplicates win, as with encoding/json.
func (f *hotFrame) set(key, val []byte) bool {
	switch string(key) {
	case "type":
		// Only the two call-path types are taken here; naming them by
		// constant saves an allocation per frame.
		switch string(val) {
		case `"invokefunction"`:
			f.typ = string(protocol.TypeInvokeFunction)
		case `"invocationresult"`:
			f.typ = string(protocol.TypeInvocationResult)
		default:
			return false
		}
	case "invocation_id":
		s, ok := plainString(val, true)
		f.invocationID = s
		return ok
	case "function_id":
		s, ok := plainString(val, true)
		f.functionID = s
		return ok
	case "traceparent":
		s, ok := plainString(val, true)
		f.traceparent = s
		return ok
	case "baggage":
		s, ok := plainString(val, true)
		f.baggage = s
		return ok
	case "namespace":
		if string(val) == "null" {
			f.namespace = nil
			return true
		}
		s, ok := plainString(val, false)
		if ok {
			f.namespace = &s
		}
		return ok
	case "data":
		f.data = val
	case "result":
		f.result = val
	case "metadata":
		f.metadata = val
	case "action":
		f.action = val
	case "error":
		f.errorRaw = val
	}
	return true
}

// plainString returns the contents of a JSON string without escapes and
// with valid UTF-8; null counts as "" when allowed. Anything else is left
// to the slow path.
func plainString(val []byte, nullOK bool) (string, bool) {
	if nullOK && string(val) == "null" {
		return "", true
	}
	if len(val) < 2 || val[0] != '"' {
		return "", false
	}
	in := val[1 : len(val)-1]
	for _, c := range in {
		if c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}

// scanner is a strict JSON validator over a byte slice.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) consume(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str scans a string at s.i and returns the span of its contents and whether
// it is free of escapes; start < 0 means invalid.
func (s *scanner) str() (start, end int, plain bool) {
	if !s.consume('"') {
		return -1, -1, false
	}
	start = s.i
	plain = true
	b := s.b
	for i := s.i; i < len(b); {
		// Skip eight ordinary bytes at a time: payloads are mostly long
		// strings, and this loop is the fast path's whole cost on them.
		for i+8 <= len(b) && !specialInWord(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			s.i = i + 1
			return start, i, plain
		case c == '\\':
			plain = false
			if i+1 >= len(b) {
				return -1, -1, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return -1, -1, false
				}
				i += 6
			default:
				return -1, -1, false
			}
		case c < 0x20:
			return -1, -1, false
		default:
			i++
		}
	}
	return -1, -1, false
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// specialInWord reports whether any of the eight bytes in w is '"', '\\' or
// a control character (< 0x20): the bytes a string scan must stop at.
func specialInWord(w uint64) bool {
	hasZero := func(v uint64) uint64 { return (v - lsb) & ^v & msb }
	quote := hasZero(w ^ (lsb * '"'))
	backslash := hasZero(w ^ (lsb * '\\'))
	control := (w - lsb*0x20) & ^w & msb
	return quote|backslash|control != 0
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// value validates one JSON value at s.i.
func (s *scanner) value(depth int) bool {
	if s.i >= len(s.b) || depth > maxScanDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		st, _, _ := s.str()
		return st >= 0
	case c == '{':
		s.i++
		s.ws()
		if s.consume('}') {
			return true
		}
		for {
			s.ws()
			if st, _, _ := s.str(); st < 0 {
				return false
			}
			s.ws()
			if !s.consume(':') {
				return false
			}
			s.ws()
			if !s.value(depth + 1) {
				return false
			}
			s.ws()
			if s.consume(',') {
				continue
			}
			return s.consume('}')
		}
	case c == '[':
		s.i++
		s.ws()
		if s.consume(']') {
			return true
		}
		for {
			s.ws()
			if !s.value(depth + 1) {
				return false
			}
			s.ws()
			if s.consume(',') {
				continue
			}
			return s.consume(']')
		}
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	}
	return false
}

func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

func (s *scanner) number() bool {
	s.consume('-')
	if s.consume('0') {
		// no leading zeros
	} else if s.i < len(s.b) && s.b[s.i] >= '1' && s.b[s.i] <= '9' {
		s.digits()
	} else {
		return false
	}
	if s.consume('.') && s.digits() == 0 {
		return false
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if !s.consume('+') {
			s.consume('-')
		}
		if s.digits() == 0 {
			return false
		}
	}
	return true
}
