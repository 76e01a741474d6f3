package engine

import (
	"crypto/rand"
	"encoding/hex"
)

// Ids are random version-4 UUIDs, written as uuid.NewString writes them.
// Made here because every routed call takes one and every channel two
// (its id and access key): uuid.NewString costs two allocations (its
// random bytes escape through an io.Reader), these one, a channel's pair
// one for both. crypto/rand.Read does not fail; were it to, it crashes
// the program, as uuid.NewString panics.

const uuidLen = 36

// newID is one random id.
func newID() string {
	var b [uuidLen]byte
	appendUUID(b[:0])
	return string(b[:])
}

// newIDPair is two random ids sharing one string.
func newIDPair() (string, string) {
	var b [2 * uuidLen]byte
	appendUUID(appendUUID(b[:0]))
	s := string(b[:])
	return s[:uuidLen], s[uuidLen:]
}

// appendUUID appends a random version-4 UUID (8-4-4-4-12 lower-case hex).
func appendUUID(b []byte) []byte {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	var s [uuidLen]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return append(b, s[:]...)
}
