// Package jsonpretty prints JSON for people: two-space indents, members in
// the order they came, numbers exactly as written, and strings with their
// escapes undone (so "\u003c" from one encoder and "<" from another print
// the same).
package jsonpretty

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Indent renders one JSON document. Anything but exactly one valid JSON
// value is an error.
func Indent(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := writeValue(&b, dec, 0); err != nil {
		return "", err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", errors.New("trailing data after the JSON value")
	}
	return b.String(), nil
}

func writeValue(b *strings.Builder, dec *json.Decoder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return writeContainer(b, dec, depth, '}', true)
		case '[':
			return writeContainer(b, dec, depth, ']', false)
		}
		return fmt.Errorf("unexpected %q", rune(t))
	case string:
		b.WriteString(quote(t))
	case json.Number:
		b.WriteString(t.String())
	case bool:
		if t {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case nil:
		b.WriteString("null")
	default:
		return fmt.Errorf("unexpected token %v", tok)
	}
	return nil
}

func writeContainer(b *strings.Builder, dec *json.Decoder, depth int, end byte, object bool) error {
	open := byte('[')
	if object {
		open = '{'
	}
	b.WriteByte(open)
	n := 0
	for dec.More() {
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
		b.WriteString(strings.Repeat("  ", depth+1))
		if object {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, ok := tok.(string)
			if !ok {
				return errors.New("object key is not a string")
			}
			b.WriteString(quote(key))
			b.WriteString(": ")
		}
		if err := writeValue(b, dec, depth+1); err != nil {
			return err
		}
		n++
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return err
	}
	if n > 0 {
		b.WriteByte('\n')
		b.WriteString(strings.Repeat("  ", depth))
	}
	b.WriteByte(end)
	return nil
}

// quote encodes a string without HTML escaping.
func quote(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a Go string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
