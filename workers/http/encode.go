package httpworker

import (
	"slices"
	"unicode/utf8"

	"github.com/iii-sandbox/iii/protocol"
)

// marshalRequest encodes r as encoding/json would (same keys, order and
// escaping, maps sorted by key), with its body first and spliced in as
// is: parseBody already made it valid JSON. Written by hand because every
// request pays for it: encoding/json's reflection over the three maps was
// a tenth of the listener's time.
func marshalRequest(r Request) ([]byte, error) {
	n := 160 + len(r.Body) + len(r.Method) + 2*len(r.Path) + len(r.Trigger.Path)
	for _, m := range []map[string]string{r.PathParams, r.QueryParams, r.Headers} {
		for k, v := range m {
			n += len(k) + len(v) + 6
		}
	}
	b := make([]byte, 0, n)
	b = append(b, `{"body":`...)
	if len(r.Body) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, r.Body...)
	}
	b = append(b, `,"method":`...)
	b = appendJSONString(b, r.Method)
	b = append(b, `,"path":`...)
	b = appendJSONString(b, r.Path)
	b = append(b, `,"path_params":`...)
	b = appendStringMap(b, r.PathParams)
	b = append(b, `,"query_params":`...)
	b = appendStringMap(b, r.QueryParams)
	b = append(b, `,"headers":`...)
	b = appendStringMap(b, r.Headers)
	b = append(b, `,"trigger":{"type":`...)
	b = appendJSONString(b, r.Trigger.Type)
	b = append(b, `,"path":`...)
	b = appendJSONString(b, r.Trigger.Path)
	b = append(b, `,"method":`...)
	b = appendJSONString(b, r.Trigger.Method)
	b = append(b, '}')
	if r.RequestBody != nil {
		b = append(b, `,"request_body":`...)
		b = appendChannelRef(b, r.RequestBody)
	}
	if r.Response != nil {
		b = append(b, `,"response":`...)
		b = appendChannelRef(b, r.Response)
	}
	return append(b, '}'), nil
}

func appendChannelRef(b []byte, c *protocol.StreamChannelRef) []byte {
	b = append(b, `{"channel_id":`...)
	b = appendJSONString(b, c.ChannelID)
	b = append(b, `,"access_key":`...)
	b = appendJSONString(b, c.AccessKey)
	b = append(b, `,"direction":`...)
	b = appendJSONString(b, c.Direction)
	return append(b, '}')
}

// appendStringMap writes m as encoding/json does: null when nil, keys
// sorted.
func appendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	var arr [16]string
	keys := arr[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = appendJSONString(b, m[k])
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString writes s as a JSON string exactly as encoding/json
// does: HTML characters (<, >, &) and U+2028/U+2029 escaped, invalid
// UTF-8 as \ufffd.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
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
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
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
