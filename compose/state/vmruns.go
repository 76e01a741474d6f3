package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// VMWorkersFile records which adapter versions ran the project's worker VMs
// (docs/project-token.md): before sandbox-libkrun 0.3.1 a VM worker whose
// directory holds the compose file could read the project token, so the
// next `iii compose --up` replaces it.
const VMWorkersFile = "vm-workers.json"

// vmRunsVersion is the vm-workers.json format.
const vmRunsVersion = 1

// maxVMRuns bounds the file: one record per worker VM and adapter version
// is plenty, and a file that grows without end would be a slow leak.
const maxVMRuns = 1024

// VMRun says that an adapter, at a version, started a worker VM of the
// project.
type VMRun struct {
	Container string `json:"container"`
	VMID      string `json:"vm_id"`
	Adapter   string `json:"adapter"`
	// AdapterVersion is the adapter package's version from the lock (or,
	// for an adapter Compose did not start, what adapter::info reported).
	AdapterVersion string `json:"adapter_version"`
	HostDir        string `json:"host_dir"`
	// HoldsComposeFile: the directory copied into the VM contains the
	// compose file, and so the project's .iii state.
	HoldsComposeFile bool      `json:"holds_compose_file"`
	At               time.Time `json:"at"`
}

// VMRuns is vm-workers.json.
type VMRuns struct {
	Version int     `json:"version"`
	Runs    []VMRun `json:"runs"`
}

// VMRunsPath is vm-workers.json.
func (s *Store) VMRunsPath() string { return filepath.Join(s.dir, VMWorkersFile) }

// DecodeVMRuns reads vm-workers.json. A file Compose cannot read is
// INVALID_STATE_FILE: silently dropping it could keep a token a VM read.
func DecodeVMRuns(data []byte, path string) (*VMRuns, error) {
	bad := func(format string, args ...any) error {
		return newInvalid(path, fmt.Sprintf(format, args...)+"; delete it, then stop Compose and run `iii compose --up` to replace the project token")
	}
	var r VMRuns
	if problem := decodeStrict(data, &r, "vm-workers file"); problem != "" {
		return nil, bad("%s", problem)
	}
	if r.Version != vmRunsVersion {
		return nil, bad("version %d is not supported (this Compose writes version %d)", r.Version, vmRunsVersion)
	}
	if len(r.Runs) > maxVMRuns {
		return nil, bad("%d records, more than the %d Compose keeps", len(r.Runs), maxVMRuns)
	}
	for i, run := range r.Runs {
		if run.VMID == "" || run.Adapter == "" {
			return nil, bad("record %d has no vm_id or adapter", i)
		}
	}
	return &r, nil
}

// LoadVMRuns reads vm-workers.json; an empty record set when there is none.
func (s *Store) LoadVMRuns() (*VMRuns, error) {
	data, err := os.ReadFile(s.VMRunsPath())
	if errors.Is(err, os.ErrNotExist) {
		return &VMRuns{Version: vmRunsVersion}, nil
	}
	if err != nil {
		return nil, ioError("read "+s.VMRunsPath(), err)
	}
	return DecodeVMRuns(data, s.VMRunsPath())
}

// SaveVMRuns writes vm-workers.json atomically, owner-only.
func (s *Store) SaveVMRuns(r *VMRuns) error {
	r.Version = vmRunsVersion
	if r.Runs == nil {
		r.Runs = []VMRun{}
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return ioError("encode "+s.VMRunsPath(), err)
	}
	if err := writeAtomic(s.VMRunsPath(), append(data, '\n'), 0o600); err != nil {
		return ioError("write "+s.VMRunsPath(), err)
	}
	return nil
}

// RecordVMRun adds run to vm-workers.json. A run of the same VM by the same
// adapter version replaces the older record; the oldest records go when the
// file is full.
func (s *Store) RecordVMRun(run VMRun) error {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	r, err := s.LoadVMRuns()
	if err != nil {
		return err
	}
	kept := r.Runs[:0]
	for _, old := range r.Runs {
		if old.VMID == run.VMID && old.Adapter == run.Adapter && old.AdapterVersion == run.AdapterVersion && old.HoldsComposeFile == run.HoldsComposeFile {
			continue
		}
		kept = append(kept, old)
	}
	r.Runs = append(kept, run)
	if n := len(r.Runs) - maxVMRuns; n > 0 {
		r.Runs = r.Runs[n:]
	}
	return s.SaveVMRuns(r)
}

// DropVMRuns removes the records drop selects and reports how many went.
func (s *Store) DropVMRuns(drop func(VMRun) bool) (int, error) {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	r, err := s.LoadVMRuns()
	if err != nil {
		return 0, err
	}
	kept := r.Runs[:0]
	n := 0
	for _, run := range r.Runs {
		if drop(run) {
			n++
			continue
		}
		kept = append(kept, run)
	}
	if n == 0 {
		return 0, nil
	}
	r.Runs = kept
	return n, s.SaveVMRuns(r)
}

// decodeStrict reads data as exactly one JSON object into v, refusing
// unknown fields: what it cannot trust it describes ("" when none), naming
// the file by what.
func decodeStrict(data []byte, v any, what string) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Sprintf("not a Compose %s (%v)", what, err)
	}
	if dec.More() {
		return "trailing data after the object"
	}
	return ""
}
