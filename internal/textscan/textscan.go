// Package textscan holds the limits and the small text rules that every
// implementation of the sandbox contract's fs::grep and fs::sed shares: the
// SDK's fsops (host directories) and the libkrun guest agent, which must
// stay free of the contract's gRPC dependencies and so cannot import
// fsops. One definition keeps the two answering alike.
package textscan

import (
	"bytes"
	"unicode/utf8"
)

const (
	// MaxLine is the longest part of one line grep matches against; the
	// rest of a longer line is skipped, so a minified file cannot make a
	// single line hold many megabytes.
	MaxLine = 1 << 20
	// BinarySniff is how much of a file's start is checked for a NUL
	// byte, the sign of a binary file, which grep and a walking sed skip.
	BinarySniff = 8 << 10
	// MaxSedFile is the largest file sed rewrites; it is read whole.
	MaxSedFile = 64 << 20
)

// IsBinary applies grep's rule to the start of a file: a NUL byte means
// binary.
func IsBinary(head []byte) bool { return bytes.IndexByte(head, 0) >= 0 }

// CutLine bounds a matched line to at most n bytes, cut at a UTF-8
// character boundary, with a trailing "…" to show it was cut. A negative
// n counts as 0.
func CutLine(line []byte, n int) string {
	if len(line) <= n {
		return string(line)
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(line[cut]) {
		cut--
	}
	return string(line[:cut]) + "…"
}
