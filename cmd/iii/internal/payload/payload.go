// Package payload builds the payload of `iii call` from its --json flag and
// KEY=VALUE tokens, with exactly the rules of the iii CLI (spec §2.2):
//
//  1. nothing given: {}
//  2. only --json: the JSON value as is (any JSON type)
//  3. only tokens: an object; each token splits at its first '='; the value
//     is JSON when it parses as JSON, else the literal string
//  4. both: --json must be an object, and the tokens override its
//     top-level keys (shallow merge)
//  5. a repeated key: the last one wins
package payload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Error codes of a payload that cannot be built; the CLI shows them as
// usage errors.
const (
	CodeInvalidJSON = "INVALID_JSON"
	CodeJSONNotObj  = "JSON_NOT_OBJECT"
	CodeBadToken    = "INVALID_KEY_VALUE"
)

// Error is a payload that cannot be built.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Parse builds the payload. jsonSet says whether --json was given at all
// (an empty --json is then invalid JSON, not "absent").
func Parse(tokens []string, jsonText string, jsonSet bool) (json.RawMessage, error) {
	var base json.RawMessage
	if jsonSet {
		trimmed := bytes.TrimSpace([]byte(jsonText))
		if !utf8.Valid(trimmed) {
			return nil, &Error{Code: CodeInvalidJSON, Message: "--json is not valid UTF-8"}
		}
		if !json.Valid(trimmed) {
			return nil, &Error{Code: CodeInvalidJSON, Message: "--json is not valid JSON: " + jsonError(trimmed)}
		}
		base = trimmed
	}
	if len(tokens) == 0 {
		if base != nil {
			return compact(base), nil
		}
		return json.RawMessage(`{}`), nil
	}

	obj := newObject()
	if base != nil {
		if base[0] != '{' {
			return nil, &Error{Code: CodeJSONNotObj, Message: "--json must be an object when combined with kv pairs"}
		}
		if err := obj.load(base); err != nil {
			return nil, &Error{Code: CodeInvalidJSON, Message: "--json is not valid JSON: " + err.Error()}
		}
	}
	for _, tok := range tokens {
		// Invalid UTF-8 cannot survive JSON encoding unchanged (it would
		// become U+FFFD), so refuse it rather than send something else.
		if !utf8.ValidString(tok) {
			return nil, &Error{Code: CodeBadToken, Message: fmt.Sprintf("invalid argument %q: not valid UTF-8", tok)}
		}
		key, value, ok := strings.Cut(tok, "=")
		if !ok {
			return nil, &Error{Code: CodeBadToken, Message: fmt.Sprintf("invalid argument %q: expected key=value", tok)}
		}
		if key == "" {
			return nil, &Error{Code: CodeBadToken, Message: fmt.Sprintf("invalid argument %q: empty key", tok)}
		}
		obj.set(key, tokenValue(value))
	}
	return obj.encode()
}

// tokenValue decodes a token's value as JSON when it is JSON, and keeps it
// as a string otherwise ("10" is a number, "alice" a string).
func tokenValue(v string) json.RawMessage {
	t := bytes.TrimSpace([]byte(v))
	if len(t) > 0 && json.Valid(t) {
		return compact(t)
	}
	s, _ := json.Marshal(v) // a Go string always encodes
	return s
}

func compact(raw []byte) json.RawMessage {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// jsonError is the decoder's complaint about invalid JSON.
func jsonError(raw []byte) string {
	if len(raw) == 0 {
		return "empty input"
	}
	var v any
	err := json.Unmarshal(raw, &v)
	if err == nil {
		return "invalid JSON"
	}
	return err.Error()
}

// object is a JSON object that keeps its keys in first-seen order, so the
// payload reads the way the user wrote it.
type object struct {
	keys []string
	vals map[string]json.RawMessage
}

func newObject() *object { return &object{vals: make(map[string]json.RawMessage)} }

func (o *object) set(k string, v json.RawMessage) {
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

// load reads the members of a JSON object in order; a duplicated key keeps
// its first position and its last value, like JSON decoders do.
func (o *object) load(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // the opening brace
		return err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, ok := tok.(string)
		if !ok {
			return errors.New("object key is not a string")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		o.set(key, compact(v))
	}
	return nil
}

func (o *object) encode() (json.RawMessage, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, &Error{Code: CodeBadToken, Message: fmt.Sprintf("key %q cannot be encoded", k)}
		}
		b.Write(kb)
		b.WriteByte(':')
		b.Write(o.vals[k])
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
