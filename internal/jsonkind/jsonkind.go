// Package jsonkind names the JSON type of a raw value the way request
// decoders' messages do ("must be a string, not an object"), so the
// contract and the adapter SDK word the same mistake the same way.
package jsonkind

import "bytes"

// Of names the JSON type of raw with its article: "a string", "an
// object", "an array", "a boolean", "a number", "null", or "nothing" for
// empty input. It looks only at the first byte, so it is meant for values
// a JSON decoder already accepted.
func Of(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}
