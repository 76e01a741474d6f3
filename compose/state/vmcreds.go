package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// VMCredentialsFile keeps the engine credentials Compose issued to the
// project's VM workers, by vm_id (owner-only, like the project token).
// They are issued with persist, so they outlive an engine restart; a
// Compose killed with SIGKILL never revoked them. The next Compose reads
// this file: a credential whose worker VM still runs is handed to it
// again, any other is revoked (docs/security.md, "Persisted credentials").
const VMCredentialsFile = "vm-credentials.json"

// vmCredsVersion is the vm-credentials.json format.
const vmCredsVersion = 1

// maxVMCredentials bounds the file, as maxVMRuns does vm-workers.json.
const maxVMCredentials = 1024

type vmCredsFile struct {
	Version     int               `json:"version"`
	Credentials map[string]string `json:"credentials"`
}

// VMCredentialsPath is vm-credentials.json.
func (s *Store) VMCredentialsPath() string { return filepath.Join(s.dir, VMCredentialsFile) }

// DecodeVMCredentials reads vm-credentials.json: vm_id → token.
func DecodeVMCredentials(data []byte, path string) (map[string]string, error) {
	bad := func(format string, args ...any) error {
		return newInvalid(path, fmt.Sprintf(format, args...)+"; delete it (the credentials it names stay valid in the engine until revoked or the engine's credentials file is cleared)")
	}
	var f vmCredsFile
	if problem := decodeStrict(data, &f, "vm-credentials file"); problem != "" {
		return nil, bad("%s", problem)
	}
	if f.Version != vmCredsVersion {
		return nil, bad("version %d is not supported (this Compose writes version %d)", f.Version, vmCredsVersion)
	}
	if len(f.Credentials) > maxVMCredentials {
		return nil, bad("%d credentials, more than the %d Compose keeps", len(f.Credentials), maxVMCredentials)
	}
	for id, tok := range f.Credentials {
		if id == "" || tok == "" {
			return nil, bad("an entry without a vm_id or a token")
		}
	}
	if f.Credentials == nil {
		f.Credentials = map[string]string{}
	}
	return f.Credentials, nil
}

// LoadVMCredentials reads vm-credentials.json; none when there is no file.
func (s *Store) LoadVMCredentials() (map[string]string, error) {
	data, err := os.ReadFile(s.VMCredentialsPath())
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, ioError("read "+s.VMCredentialsPath(), err)
	}
	return DecodeVMCredentials(data, s.VMCredentialsPath())
}

// SetVMCredential records the credential of a worker VM, or with token ""
// forgets it. The file goes when it holds none.
func (s *Store) SetVMCredential(vmID, token string) error {
	s.credsMu.Lock()
	defer s.credsMu.Unlock()
	m, err := s.LoadVMCredentials()
	if err != nil {
		return err
	}
	if token == "" {
		if _, ok := m[vmID]; !ok {
			return nil
		}
		delete(m, vmID)
	} else {
		if _, ok := m[vmID]; !ok && len(m) >= maxVMCredentials {
			return ioError("write "+s.VMCredentialsPath(), fmt.Errorf("it holds %d credentials already", len(m)))
		}
		m[vmID] = token
	}
	if len(m) == 0 {
		if err := os.Remove(s.VMCredentialsPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return ioError("remove "+s.VMCredentialsPath(), err)
		}
		return nil
	}
	data, err := json.MarshalIndent(vmCredsFile{Version: vmCredsVersion, Credentials: m}, "", "  ")
	if err != nil {
		return ioError("encode "+s.VMCredentialsPath(), err)
	}
	if err := writeAtomic(s.VMCredentialsPath(), append(data, '\n'), 0o600); err != nil {
		return ioError("write "+s.VMCredentialsPath(), err)
	}
	return nil
}
