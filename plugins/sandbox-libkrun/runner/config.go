package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

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
}

// Validate checks a configuration before it is written or used.
func (c *Config) Validate() error {
	if c.Version != ConfigVersion {
		return fmt.Errorf("runner configuration version %d, this binary understands %d (was the adapter binary replaced while it ran?)", c.Version, ConfigVersion)
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
