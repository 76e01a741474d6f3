package boot

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
)

func TestProbeCache(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	results := []qemu.AccelResult{
		{Accel: "kvm", Reason: "no hello from the guest within 5s"},
		{Accel: "tcg", OK: true, TimeToHello: 1900 * time.Millisecond},
	}
	_, ok := loadProbeCache(dir, "fp", now)
	assert.Check(t, !ok, "an empty cache hits")
	assert.NilError(t, saveProbeCache(dir, "fp", results, now))

	got, ok := loadProbeCache(dir, "fp", now.Add(time.Hour))
	assert.Assert(t, ok)
	assert.DeepEqual(t, got, results)
	_, ok = loadProbeCache(dir, "other", now)
	assert.Check(t, !ok, "another fingerprint hits")
	_, ok = loadProbeCache(dir, "fp", now.Add(25*time.Hour))
	assert.Check(t, !ok, "a stale entry hits")
	_, ok = loadProbeCache(dir, "fp", now.Add(-time.Minute))
	assert.Check(t, !ok, "an entry from the future hits")

	assert.NilError(t, os.WriteFile(filepath.Join(dir, probeCacheName), []byte("{garbage"), 0o644))
	_, ok = loadProbeCache(dir, "fp", now)
	assert.Check(t, !ok)
}

func TestProbeFingerprint(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "k")
	assert.NilError(t, os.WriteFile(k, []byte("a"), 0o644))
	fp := probeFingerprint("/usr/bin/qemu-system-x86_64", k, "/i", []string{"kvm", "tcg"})
	assert.Equal(t, fp, probeFingerprint("/usr/bin/qemu-system-x86_64", k, "/i", []string{"kvm", "tcg"}))
	assert.Check(t, fp != probeFingerprint("/usr/bin/qemu-system-x86_64", k, "/i", []string{"tcg"}))
	assert.NilError(t, os.WriteFile(k, []byte("ab"), 0o644))
	assert.Check(t, fp != probeFingerprint("/usr/bin/qemu-system-x86_64", k, "/i", []string{"kvm", "tcg"}), "a new kernel must change it")
}

func FuzzDecodeProbeCache(f *testing.F) {
	f.Add([]byte(`{"version":1,"fingerprint":"x","created":"2026-11-29T10:00:00Z","results":[{"Accel":"tcg","OK":true,"Reason":"","TimeToHello":1}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeProbeCache(b)
		if err != nil {
			return
		}
		if c.Fingerprint == "" || len(c.Results) == 0 {
			t.Fatalf("accepted %+v", c)
		}
	})
}
