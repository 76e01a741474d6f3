package protocol

// EncodeFast renders a message exactly as Encode does (byte for byte), but
// writes the two call-path frames (invokefunction and invocationresult)
// directly instead of through encoding/json, which re-validates and
// compacts every raw payload and then copies the frame once more to put
// "type" first. A payload it cannot copy as is (invalid, or holding
// whitespace or characters encoding/json escapes: <, >, &, U+2028,
// U+2029), a string that needs escaping, and every other frame type go
// through Encode.
func EncodeFast(m Message) ([]byte, error) {
	var b []byte
	ok := false
	switch m := m.(type) {
	case *InvokeFunction:
		b, ok = appendInvoke(m)
	case *InvocationResult:
		b, ok = appendResult(m)
	}
	if !ok {
		return Encode(m)
	}
	return b, nil
}

func appendInvoke(m *InvokeFunction) ([]byte, bool) {
	b := make([]byte, 0, 96+len(m.InvocationID)+len(m.FunctionID)+len(m.Data)+len(m.Metadata)+len(m.Traceparent)+len(m.Baggage))
	b = append(b, `{"type":"invokefunction"`...)
	ok := true
	if m.InvocationID != "" {
		b, ok = appendField(b, "invocation_id", m.InvocationID, ok)
	}
	b, ok = appendField(b, "function_id", m.FunctionID, ok)
	if len(m.Data) > 0 {
		b, ok = appendRaw(b, "data", m.Data, ok)
	}
	if m.Traceparent != "" {
		b, ok = appendField(b, "traceparent", m.Traceparent, ok)
	}
	if m.Baggage != "" {
		b, ok = appendField(b, "baggage", m.Baggage, ok)
	}
	if m.Action != nil {
		b = append(b, `,"action":{`...)
		b, ok = appendString(b, "type", string(m.Action.Type), ok)
		if m.Action.Queue != "" {
			b, ok = appendField(b, "queue", m.Action.Queue, ok)
		}
		b = append(b, '}')
	}
	if len(m.Metadata) > 0 {
		b, ok = appendRaw(b, "metadata", m.Metadata, ok)
	}
	if m.Namespace != nil {
		b, ok = appendField(b, "namespace", *m.Namespace, ok)
	}
	return append(b, '}'), ok
}

func appendResult(m *InvocationResult) ([]byte, bool) {
	b := make([]byte, 0, 96+len(m.InvocationID)+len(m.FunctionID)+len(m.Result)+len(m.Traceparent)+len(m.Baggage))
	b = append(b, `{"type":"invocationresult"`...)
	ok := true
	b, ok = appendField(b, "invocation_id", m.InvocationID, ok)
	b, ok = appendField(b, "function_id", m.FunctionID, ok)
	if len(m.Result) > 0 {
		b, ok = appendRaw(b, "result", m.Result, ok)
	}
	if m.Error != nil {
		b = append(b, `,"error":{`...)
		b, ok = appendString(b, "code", m.Error.Code, ok)
		b, ok = appendField(b, "message", m.Error.Message, ok)
		if m.Error.Stacktrace != "" {
			b, ok = appendField(b, "stacktrace", m.Error.Stacktrace, ok)
		}
		b = append(b, '}')
	}
	if m.Traceparent != "" {
		b, ok = appendField(b, "traceparent", m.Traceparent, ok)
	}
	if m.Baggage != "" {
		b, ok = appendField(b, "baggage", m.Baggage, ok)
	}
	return append(b, '}'), ok
}

// appendField appends `,"key":"val"`.
func appendField(b []byte, key, val string, ok bool) ([]byte, bool) {
	b = append(b, ',')
	return appendString(b, key, val, ok)
}

// appendString appends `"key":"val"`; ok turns false when val needs
// escaping (encoding/json then writes it).
func appendString(b []byte, key, val string, ok bool) ([]byte, bool) {
	b = append(b, '"')
	b = append(b, key...)
	b = append(b, `":"`...)
	for i := 0; i < len(val); i++ {
		c := val[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			ok = false
			break
		}
	}
	b = append(b, val...)
	return append(b, '"'), ok
}

// appendRaw appends `,"key":raw` when encoding/json would write raw
// unchanged: valid, without whitespace between tokens and without the
// characters it escapes.
func appendRaw(b []byte, key string, raw []byte, ok bool) ([]byte, bool) {
	if !ok || !verbatimJSON(raw) {
		return b, false
	}
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return append(b, raw...), ok
}

// verbatimJSON reports whether raw is one valid JSON value that
// encoding/json's compaction (with HTML escaping) leaves as it is.
func verbatimJSON(raw []byte) bool {
	inString, escaped := false, false
	for i, c := range raw {
		switch {
		case c == '<' || c == '>' || c == '&':
			return false
		case c == 0xe2 && i+2 < len(raw) && raw[i+1] == 0x80 && (raw[i+2] == 0xa8 || raw[i+2] == 0xa9):
			return false // U+2028, U+2029
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			return false
		}
	}
	s := jsonScanner{b: raw}
	return s.value(1) && s.i == len(raw)
}
