package protocol

import (
	"encoding/binary"
	"encoding/json"
	"unicode/utf8"
)

// DecodeFast decodes one frame like Decode, with the same result and the
// same errors, but reads the two call-path frames (invokefunction and
// invocationresult) in one pass over the frame instead of encoding/json's
// two (the "type" head, then the whole frame into its struct, each with
// its own validation). Every other frame, and any call-path frame with
// something unusual (escaped or non-lowercase keys, escaped ids, a field
// of an unexpected JSON type, invalid JSON, deep nesting), goes through
// Decode, so behaviour is defined in one place.
//
// Unlike Decode, the json.RawMessage fields of a frame decoded on the fast
// path (Data, Metadata, Result) are sub-slices of data, not copies: the
// caller must not modify data afterwards.
func DecodeFast(data []byte) (Message, error) {
	var f CallFrame
	if !ScanCallFrame(data, &f) {
		return Decode(data)
	}
	switch f.Type {
	case TypeInvokeFunction:
		m := &InvokeFunction{InvocationID: f.InvocationID, FunctionID: f.FunctionID, Data: nonNull(f.Data),
			Metadata: nonNull(f.Metadata), Traceparent: f.Traceparent, Baggage: f.Baggage, Namespace: f.Namespace}
		if a := nonNull(f.Action); a != nil {
			var act TriggerAction
			if json.Unmarshal(a, &act) != nil {
				return Decode(data)
			}
			m.Action = &act
		}
		return m, nil
	case TypeInvocationResult:
		m := &InvocationResult{InvocationID: f.InvocationID, FunctionID: f.FunctionID, Result: f.Result,
			Traceparent: f.Traceparent, Baggage: f.Baggage}
		if er := nonNull(f.Error); er != nil {
			m.Error = new(ErrorBody)
			if json.Unmarshal(er, m.Error) != nil {
				return Decode(data)
			}
		}
		return m, nil
	}
	return Decode(data)
}

// CallFrame holds the top-level members of a call-path frame
// (invokefunction or invocationresult) as ScanCallFrame reads them. The
// raw members are sub-slices of the frame, nil when absent and "null" as
// written; the nested Action and Error are left for the caller to decode.
// The engine reads its call path with it directly, so the frame is not
// copied into a Message on the way.
type CallFrame struct {
	Type         Type
	InvocationID string
	FunctionID   string
	Traceparent  string
	Baggage      string
	Namespace    *string
	Data         []byte
	Result       []byte
	Metadata     []byte
	Action       []byte
	Error        []byte
}

// maxFastDepth is kept well under encoding/json's nesting limit (10000):
// anything deeper is left to Decode, so the fast path never accepts what
// Decode refuses.
const maxFastDepth = 9000

// ScanCallFrame validates data as one JSON object and fills f from its top
// level as encoding/json would fill InvokeFunction or InvocationResult. It
// reports false when the frame is not a call-path frame it can take as is
// (see DecodeFast): the caller then decodes data with Decode, which
// defines every answer, errors included.
func ScanCallFrame(data []byte, f *CallFrame) bool {
	s := jsonScanner{b: data}
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
		if ks < 0 || !plain || !plainKey(data[ks:ke]) {
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
		if !f.set(key, data[vs:s.i]) {
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
	return s.i == len(data) && (f.Type == TypeInvokeFunction || f.Type == TypeInvocationResult)
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

// set records one member as encoding/json would: later duplicates win, and
// null leaves a string field as it was.
func (f *CallFrame) set(key, val []byte) bool {
	switch string(key) {
	case "type":
		switch string(val) {
		case `"invokefunction"`:
			f.Type = TypeInvokeFunction
		case `"invocationresult"`:
			f.Type = TypeInvocationResult
		default:
			return false
		}
	case "invocation_id":
		return plainString(val, &f.InvocationID)
	case "function_id":
		return plainString(val, &f.FunctionID)
	case "traceparent":
		return plainString(val, &f.Traceparent)
	case "baggage":
		return plainString(val, &f.Baggage)
	case "namespace":
		if string(val) == "null" {
			f.Namespace = nil
			return true
		}
		var s string
		if !plainString(val, &s) {
			return false
		}
		f.Namespace = &s
	case "data":
		f.Data = val
	case "result":
		f.Result = val
	case "metadata":
		f.Metadata = val
	case "action":
		f.Action = val
	case "error":
		f.Error = val
	}
	return true
}

// plainString stores the contents of a JSON string without escapes and with
// valid UTF-8 in dst; null leaves dst as it is. Anything else is left to
// the slow path.
func plainString(val []byte, dst *string) bool {
	if string(val) == "null" {
		return true
	}
	if len(val) < 2 || val[0] != '"' {
		return false
	}
	in := val[1 : len(val)-1]
	for _, c := range in {
		if c == '\\' {
			return false
		}
	}
	if !utf8.Valid(in) {
		return false
	}
	*dst = string(in)
	return true
}

// jsonScanner is a strict JSON validator over a byte slice.
type jsonScanner struct {
	b    []byte
	i    int
	deep bool // gave up on nesting deeper than maxFastDepth
}

// Valid reports whether data is one valid JSON value, as json.Valid does
// (surrounding whitespace allowed, strings' UTF-8 not checked), in one
// quicker pass; only a value nested deeper than the fast scanner goes is
// left to json.Valid.
func Valid(data []byte) bool {
	s := jsonScanner{b: data}
	s.ws()
	ok := s.value(1)
	if s.deep {
		return json.Valid(data)
	}
	s.ws()
	return ok && s.i == len(data)
}

func (s *jsonScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScanner) consume(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str scans a string at s.i and returns the span of its contents and whether
// it is free of escapes; start < 0 means invalid.
func (s *jsonScanner) str() (start, end int, plain bool) {
	if !s.consume('"') {
		return -1, -1, false
	}
	start = s.i
	plain = true
	b := s.b
	for i := s.i; i < len(b); {
		// Skip eight ordinary bytes at a time: payloads are mostly
		// strings.
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
func (s *jsonScanner) value(depth int) bool {
	if depth > maxFastDepth {
		s.deep = true
		return false
	}
	if s.i >= len(s.b) {
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

func (s *jsonScanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

func (s *jsonScanner) digits() int {
	n := 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

func (s *jsonScanner) number() bool {
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

// ObjectMembers reads data as one JSON object and calls fn with each
// top-level member in order: the key's contents and the value's raw bytes
// (sub-slices of data). It reports false, having called fn for some
// members or none, when data is not one valid JSON object, when a key holds
// escapes, or when the object nests deeper than encoding/json allows; fn
// returning false stops it with false too. A caller uses it as the fast
// path of a decode and falls back to encoding/json when it reports false.
func ObjectMembers(data []byte, fn func(key, val []byte) bool) bool {
	s := jsonScanner{b: data}
	s.ws()
	if !s.consume('{') {
		return false
	}
	s.ws()
	if s.consume('}') {
		s.ws()
		return s.i == len(data)
	}
	for {
		s.ws()
		ks, ke, plain := s.str()
		if ks < 0 || !plain {
			return false
		}
		s.ws()
		if !s.consume(':') {
			return false
		}
		s.ws()
		vs := s.i
		if !s.value(1) || !fn(data[ks:ke], data[vs:s.i]) {
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
	return s.i == len(data)
}

// PlainString returns the contents of a JSON string value that holds no
// escapes and only valid UTF-8 (what encoding/json would decode to the same
// bytes); ok is false for anything else, null included.
func PlainString(val []byte) (s string, ok bool) {
	if len(val) < 2 || val[0] != '"' || val[len(val)-1] != '"' {
		return "", false
	}
	in := val[1 : len(val)-1]
	for _, c := range in {
		if c == '\\' || c == '"' || c < 0x20 {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}

// PlainKey reports whether key is lowercase ASCII letters, digits and
// underscores: such a key matches a struct field's lowercase JSON name in
// encoding/json exactly, with no case folding to consider.
func PlainKey(key []byte) bool { return plainKey(key) }

// ArrayElements reads data as one JSON array and calls fn with each
// element's raw bytes (sub-slices of data), in order. It reports false when
// data is not one valid JSON array (or nests deeper than encoding/json
// allows), or when fn returns false.
func ArrayElements(data []byte, fn func(elem []byte) bool) bool {
	s := jsonScanner{b: data}
	s.ws()
	if !s.consume('[') {
		return false
	}
	s.ws()
	if !s.consume(']') {
		for {
			s.ws()
			vs := s.i
			if !s.value(1) || !fn(data[vs:s.i]) {
				return false
			}
			s.ws()
			if s.consume(',') {
				continue
			}
			if s.consume(']') {
				break
			}
			return false
		}
	}
	s.ws()
	return s.i == len(data)
}
