package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
)

// ConfigVersion is the layout of runner.json. The adapter and the runner
// are the same binary, so a mismatch only happens when a binary is replaced
// under a running adapter; the runner then refuses rather than guess.
const ConfigVersion = 1

// maxConfigBytes bounds runner.json; a real one is well under 4 KiB.
const maxConfigBytes = 64 << 10

// Config is what the adapter tells a runner: which back end runs which VM.
type Config struct {
	Version int          `json:"version"`
	Backend string       `json:"backend"`
	Spec    backend.Spec `json:"spec"`
	// LogLevel is the runner's log level (trace … error); empty is info.
	LogLevel string `json:"log_level,omitempty"`
	// AdoptGraceMS is how long the runner keeps its VM once its adapter
	// let go without stopping it (Process.Detach, or the adapter died),
	// waiting for a new adapter to Adopt it; past it the runner kills the
	// VM and exits. 0: the runner kills its VM as soon as its lifeline
	// ends, and serves no adoption socket.
	AdoptGraceMS uint64 `json:"adopt_grace_ms,omitempty"`
}

// MaxAdoptGraceMS bounds Config.AdoptGraceMS (a day): a grace is meant to
// span an adapter restart, not to park VMs nobody watches.
const MaxAdoptGraceMS = 24 * 60 * 60 * 1000

// maxAdoptSocketPath bounds runner.sock's path: sun_path holds 104 bytes on
// macOS (108 on Linux), NUL included. backend.MaxSocketPath keeps exec.sock
// under 100, which leaves runner.sock, two bytes longer, room enough.
const maxAdoptSocketPath = 104

// AdoptGrace is AdoptGraceMS as a duration.
func (c *Config) AdoptGrace() time.Duration {
	return time.Duration(c.AdoptGraceMS) * time.Millisecond
}

// Validate checks a configuration before it is written or used.
func (c *Config) Validate() error {
	if c.Version != ConfigVersion {
		return fmt.Errorf("runner configuration version %d, this binary understands %d (was the adapter binary replaced while it ran?)", c.Version, ConfigVersion)
	}
	if c.AdoptGraceMS > MaxAdoptGraceMS {
		return fmt.Errorf("adopt_grace_ms %d is more than %d (a day)", c.AdoptGraceMS, MaxAdoptGraceMS)
	}
	if sock := filepath.Join(c.Spec.StateDir, AdoptSocketName); c.AdoptGraceMS > 0 && len(sock) >= maxAdoptSocketPath {
		return fmt.Errorf("adoption socket path %s is %d bytes; unix sockets allow fewer than %d: use a shorter state_dir", sock, len(sock), maxAdoptSocketPath)
	}
	switch c.Backend {
	case backend.QEMU, backend.Libkrun:
	default:
		return fmt.Errorf("unknown back end %q", c.Backend)
	}
	return c.Spec.Validate()
}

// Encode returns the configuration as runner.json holds it.
func (c *Config) Encode() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return json.MarshalIndent(c, "", "  ")
}

// DecodeConfig parses runner.json strictly: one JSON object of known
// fields, nothing after it, and a valid configuration.
func DecodeConfig(b []byte) (*Config, error) {
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("runner configuration is %d bytes, more than %d", len(b), maxConfigBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("runner configuration: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("runner configuration: trailing data after the object")
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}
