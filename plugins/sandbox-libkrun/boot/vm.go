package boot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// What sandboxes and worker VMs share once their VM runs: how it stops, and
// how the next adapter process reads what this one left to adopt.

// How a VM stops (a sandbox's or a worker VM's): the guest is asked to power off (short, since a
// tmpfs upper layer has nothing worth flushing), then the runner is let go
// and finally killed.
const (
	ShutdownTimeout = 2 * time.Second
	// PowerOffWait is how long a QEMU VM gets to exit after the guest
	// accepted the power-off (ACPI S5 on microvm ends QEMU).
	PowerOffWait = 3 * time.Second
	// ReleaseGrace is how long a runner gets to kill its VM and exit
	// after its lifeline closes, before it is SIGKILLed.
	ReleaseGrace = 2 * time.Second
	// StopBudget bounds the whole clean-up of one sandbox.
	StopBudget = 30 * time.Second
)

// MaxRecordBytes bounds sandbox.json and runner.json; a real one is well under 8 KiB.
const MaxRecordBytes = 256 << 10

// AdoptTimeout bounds adopting one VM (a sandbox or a worker VM): the runner's handshake and the
// agent's hello (a VM that is running answers at once).
const AdoptTimeout = 20 * time.Second

// ReadJSONFile decodes a small JSON file strictly: one object of known
// fields, bounded in size. The state directory is the adapter's own, but a
// guest never writes there and neither should anything else.
func ReadJSONFile(path string, limit int64, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return err
	}
	if int64(len(b)) > limit {
		return fmt.Errorf("%s is larger than %d bytes", filepath.Base(path), limit)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	if dec.More() {
		return fmt.Errorf("%s: trailing data", filepath.Base(path))
	}
	return nil
}
