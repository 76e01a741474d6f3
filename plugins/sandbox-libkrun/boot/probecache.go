package boot

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
)

// The accelerator probe boots a VM per candidate and, on a host whose KVM
// cannot run the kernel (nested virtualisation without support), waits out
// a timeout before it tries TCG: seconds at every adapter start. Its answer
// only changes when the host, QEMU, the kernel or the initramfs does, so it
// is kept in the cache directory under a fingerprint of all of them, and
// for a day at most.
const (
	probeCacheName    = "probe.json"
	probeCacheVersion = 1
	probeCacheTTL     = 24 * time.Hour
	maxProbeCache     = 64 << 10
)

// probeCache is probe.json.
type probeCache struct {
	Version     int                `json:"version"`
	Fingerprint string             `json:"fingerprint"`
	Created     time.Time          `json:"created"`
	Results     []qemu.AccelResult `json:"results"`
}

// probeFingerprint identifies everything a probe's answer depends on.
func probeFingerprint(qemuBin, kernel, initrd string, candidates []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "v%d %s/%s\n", probeCacheVersion, runtime.GOOS, runtime.GOARCH)
	// A new host boot may bring a different kernel, module or hypervisor
	// state: never reuse across one.
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		fmt.Fprintf(h, "boot %s\n", bytes.TrimSpace(b))
	}
	for _, p := range []string{qemuBin, kernel, initrd} {
		fmt.Fprintf(h, "file %s %s\n", p, fileStamp(p))
	}
	// Whether this process may open /dev/kvm, and which device it is.
	kvm := "absent"
	if fi, err := os.Stat("/dev/kvm"); err == nil {
		kvm = fmt.Sprintf("%v %v", fi.Mode(), fi.Sys())
		if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
			_ = f.Close()
			kvm += " rw"
		}
	}
	fmt.Fprintf(h, "kvm %s\n", kvm)
	fmt.Fprintf(h, "candidates %s\n", strings.Join(candidates, ","))
	return hex.EncodeToString(h.Sum(nil))
}

func fileStamp(p string) string {
	fi, err := os.Stat(p)
	if err != nil {
		return "missing"
	}
	return fmt.Sprintf("%d %d", fi.Size(), fi.ModTime().UnixNano())
}

// loadProbeCache returns cached results for fingerprint, if fresh.
func loadProbeCache(dir, fingerprint string, now time.Time) ([]qemu.AccelResult, bool) {
	f, err := os.Open(filepath.Join(dir, probeCacheName))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxProbeCache+1))
	if err != nil || len(b) > maxProbeCache {
		return nil, false
	}
	c, err := decodeProbeCache(b)
	if err != nil || c.Fingerprint != fingerprint {
		return nil, false
	}
	if age := now.Sub(c.Created); age < 0 || age > probeCacheTTL {
		return nil, false
	}
	return c.Results, true
}

// decodeProbeCache parses probe.json; anything unexpected is an error and
// the probe simply runs again.
func decodeProbeCache(b []byte) (*probeCache, error) {
	var c probeCache
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, err
	}
	if c.Version != probeCacheVersion || c.Fingerprint == "" || len(c.Results) == 0 || len(c.Results) > 8 {
		return nil, errors.New("not a probe cache of this version")
	}
	for _, r := range c.Results {
		if r.Accel == "" || r.TimeToHello < 0 {
			return nil, errors.New("bad probe result")
		}
	}
	return &c, nil
}

// saveProbeCache writes the results atomically; failing to is harmless.
func saveProbeCache(dir, fingerprint string, results []qemu.AccelResult, now time.Time) error {
	b, err := json.MarshalIndent(probeCache{Version: probeCacheVersion, Fingerprint: fingerprint, Created: now.UTC(), Results: results}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".probe-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, probeCacheName))
}
