package protocol

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const testLease = "0123456789abcdef01234567"

func TestParseMintedID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want MintedID
		ok   bool
	}{
		{id: "m" + testLease + "-0", want: MintedID{Lease: testLease}, ok: true},
		{id: "m" + testLease + "-0s", want: MintedID{Lease: testLease, Served: true}, ok: true},
		{id: "m" + testLease + "-ff", want: MintedID{Lease: testLease, Counter: 255}, ok: true},
		{id: "m" + testLease + "-ffffffffffffffffs", want: MintedID{Lease: testLease, Counter: 1<<64 - 1, Served: true}, ok: true},
		{id: "m" + testLease + "-1ffffffffffffffff"}, // over 64 bits
		{id: "m" + testLease + "-01"}, // not canonical
		{id: "m" + testLease + "-FF"},
		{id: "m" + testLease + "-"},
		{id: "m" + testLease + "-s"},
		{id: "m" + testLease + "-1ss"},
		{id: "m" + testLease + "-1x"},
		{id: "m" + strings.ToUpper(testLease) + "-1"},
		{id: "m" + testLease[1:] + "-1"},
		{id: "x" + testLease + "-1"},
		{id: "m" + testLease + "_1"},
		{id: "0f3a7c3e-2d6b-4c1a-9f0e-1234567890ab"}, // an engine-made UUID
		{id: ""},
	} {
		got, ok := ParseMintedID(tc.id)
		assert.Check(t, is.Equal(ok, tc.ok), tc.id)
		assert.Check(t, is.DeepEqual(got, tc.want), tc.id)
	}
}

func TestAppendMintedIDRoundTrip(t *testing.T) {
	for _, c := range []uint64{0, 1, 15, 16, 1 << 40, 1<<64 - 1} {
		for _, served := range []bool{false, true} {
			id := string(AppendMintedID(nil, testLease, c, served))
			got, ok := ParseMintedID(id)
			assert.Check(t, ok, id)
			assert.Check(t, is.DeepEqual(got, MintedID{Lease: testLease, Counter: c, Served: served}), id)
		}
	}
}

// The key is the first half of HMAC-SHA256(secret, direction NUL id), in
// hex: what schemaChannelsLeaseOut documents, and what the engine and the
// client both compute through MintKeyer.
func TestMintKeyer(t *testing.T) {
	secret := []byte("a secret of the lease, 32 bytes!")
	k := NewMintKeyer(secret)
	id := "m" + testLease + "-2as"
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("read\x00" + id))
	want := hex.EncodeToString(mac.Sum(nil)[:MintKeyLen/2])
	assert.Check(t, is.Equal(k.Key(id, DirectionRead), want))
	assert.Check(t, is.Len(want, MintKeyLen))
	assert.Check(t, k.Key(id, DirectionWrite) != want, "the directions' keys differ")
	assert.Check(t, NewMintKeyer([]byte("another secret")).Key(id, DirectionRead) != want)

	// Safe for concurrent use (go test -race).
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if k.Key(id, DirectionRead) != want {
					t.Error("a concurrent key differs")
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestMintKeyAllocations(t *testing.T) {
	k := NewMintKeyer([]byte("secret"))
	id := "m" + testLease + "-2a"
	n := testing.AllocsPerRun(100, func() { _ = k.Key(id, DirectionWrite) })
	assert.Check(t, n <= 1, "%v allocations per key (its string)", n)
}

// FuzzParseMintedID: any id parses to what AppendMintedID writes back, byte
// for byte, or not at all; nothing panics.
func FuzzParseMintedID(f *testing.F) {
	for _, s := range []string{"m" + testLease + "-0", "m" + testLease + "-abcs", "m" + testLease + "-01", "mm", "", "m" + testLease + "-ffffffffffffffff0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		m, ok := ParseMintedID(id)
		if !ok {
			return
		}
		if back := string(AppendMintedID(nil, m.Lease, m.Counter, m.Served)); back != id {
			t.Fatalf("%q parsed to %+v, which writes %q", id, m, back)
		}
	})
}
