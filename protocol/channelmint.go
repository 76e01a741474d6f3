package protocol

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"strconv"
	"sync"
)

// Minted channels (engine::channels::lease): a connection that makes many
// channels most of which nobody opens (the http worker gives every request
// two) leases an id prefix and a secret from the engine once, and makes
// channel refs itself, without a call per channel. The engine learns of such
// a channel only when one of its ends is first opened: it checks the ref
// against the lease (the access key is an HMAC of the id and the direction
// under the lease's secret), and only then makes its table entry. The
// engine and the Go client both derive keys here, so the two agree by
// construction.
//
// A minted channel id is "m" + the lease id (MintLeaseIDLen lower-case hex
// digits) + "-" + a counter (lower-case hex, no leading zeros) + "s" when
// the lease holder serves the channel's writer end on demand (the engine
// tells it when the reader opens). UUIDs, the engine's own channel ids,
// never start with "m".

// MintLeaseIDLen is the length of a lease id: 12 random bytes in hex.
const MintLeaseIDLen = 24

// MintKeyLen is the length of a minted access key: 128 bits of the HMAC, in
// hex.
const MintKeyLen = 32

// maxMintCounterDigits bounds the counter's hex digits (a uint64).
const maxMintCounterDigits = 16

// MintedID is the parsed form of a minted channel id.
type MintedID struct {
	Lease   string // MintLeaseIDLen lower-case hex digits
	Counter uint64
	Served  bool // the lease holder writes it when the reader opens
}

// AppendMintedID appends the id of counter under lease.
func AppendMintedID(b []byte, lease string, counter uint64, served bool) []byte {
	b = append(b, 'm')
	b = append(b, lease...)
	b = append(b, '-')
	b = strconv.AppendUint(b, counter, 16)
	if served {
		b = append(b, 's')
	}
	return b
}

// ParseMintedID reads a minted channel id; ok is false for anything else
// (an engine-made UUID included). Only the canonical spelling parses, so an
// id has one reading.
func ParseMintedID(id string) (m MintedID, ok bool) {
	if len(id) < 1+MintLeaseIDLen+2 || id[0] != 'm' || id[1+MintLeaseIDLen] != '-' {
		return m, false
	}
	m.Lease = id[1 : 1+MintLeaseIDLen]
	if !lowerHex(m.Lease) {
		return MintedID{}, false
	}
	rest := id[2+MintLeaseIDLen:]
	if n := len(rest); n > 0 && rest[n-1] == 's' {
		m.Served, rest = true, rest[:n-1]
	}
	if len(rest) == 0 || len(rest) > maxMintCounterDigits || (rest[0] == '0' && len(rest) > 1) || !lowerHex(rest) {
		return MintedID{}, false
	}
	c, err := strconv.ParseUint(rest, 16, 64)
	if err != nil {
		return MintedID{}, false
	}
	m.Counter = c
	return m, true
}

func lowerHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// MintKeyer derives the access keys of one lease's channels. It keeps one
// keyed HMAC, reset for each key (no allocation but the key's string); safe
// for concurrent use.
type MintKeyer struct {
	mu      sync.Mutex
	mac     hash.Hash
	scratch []byte // what is hashed; the mac's Write would make a []byte(string) escape
	sum     [sha256.Size]byte
}

// NewMintKeyer keys a MintKeyer with a lease's secret.
func NewMintKeyer(secret []byte) *MintKeyer {
	return &MintKeyer{mac: hmac.New(sha256.New, secret)}
}

// Key is the access key of one end (DirectionRead or DirectionWrite) of
// the channel id: the two ends' keys differ, so a reader's ref cannot open
// the writer end.
func (k *MintKeyer) Key(id, direction string) string {
	var out [MintKeyLen]byte
	return string(k.AppendKey(out[:0], id, direction))
}

// AppendKey appends Key(id, direction) to b.
func (k *MintKeyer) AppendKey(b []byte, id, direction string) []byte {
	return k.appendKey(b, direction, id, nil)
}

// AppendKeyOf is AppendKey of an id held as bytes (it may be part of b:
// it is read before b is written).
func (k *MintKeyer) AppendKeyOf(b, id []byte, direction string) []byte {
	return k.appendKey(b, direction, "", id)
}

// appendKey keys direction NUL the id (idS or idB).
func (k *MintKeyer) appendKey(b []byte, direction, idS string, idB []byte) []byte {
	k.mu.Lock()
	k.mac.Reset()
	k.scratch = append(append(append(append(k.scratch[:0], direction...), 0), idS...), idB...)
	_, _ = k.mac.Write(k.scratch)
	sum := k.mac.Sum(k.sum[:0])
	b = hex.AppendEncode(b, sum[:MintKeyLen/2])
	k.mu.Unlock()
	return b
}
