package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// WorkerCredentialsFile keeps the engine credentials Compose issued to the
// project's workers (owner-only, like the project token): a VM worker's by
// its vm_id, the queue provider's by "queue-provider/<container>". They are
// issued with persist, so they outlive an engine restart; a Compose killed
// with SIGKILL never revoked them. The next Compose reads this file: a VM
// worker's credential whose VM still runs is handed to it again, any other
// is revoked (docs/security.md, "Persisted credentials").
const WorkerCredentialsFile = "worker-credentials.json"

// workerCredsVersion is the worker-credentials.json format.
const workerCredsVersion = 1

// maxWorkerCredentials bounds the file, as maxVMRuns does vm-workers.json.
const maxWorkerCredentials = 1024

type workerCredsFile struct {
	Version     int               `json:"version"`
	Credentials map[string]string `json:"credentials"`
}

// WorkerCredentialsPath is worker-credentials.json.
func (s *Store) WorkerCredentialsPath() string { return filepath.Join(s.dir, WorkerCredentialsFile) }

// DecodeWorkerCredentials reads worker-credentials.json: id → token.
func DecodeWorkerCredentials(data []byte, path string) (map[string]string, error) {
	bad := func(format string, args ...any) error {
		return newInvalid(path, fmt.Sprintf(format, args...)+"; delete it (the credentials it names stay valid in the engine until revoked or the engine's credentials file is cleared)")
	}
	var f workerCredsFile
	if problem := decodeStrict(data, &f, "worker-credentials file"); problem != "" {
		return nil, bad("%s", problem)
	}
	if f.Version != workerCredsVersion {
		return nil, bad("version %d is not supported (this Compose writes version %d)", f.Version, workerCredsVersion)
	}
	if len(f.Credentials) > maxWorkerCredentials {
		return nil, bad("%d credentials, more than the %d Compose keeps", len(f.Credentials), maxWorkerCredentials)
	}
	for id, tok := range f.Credentials {
		if id == "" || tok == "" {
			return nil, bad("an entry without an id or a token")
		}
	}
	if f.Credentials == nil {
		f.Credentials = map[string]string{}
	}
	return f.Credentials, nil
}

// LoadWorkerCredentials reads worker-credentials.json; none when there is no file.
func (s *Store) LoadWorkerCredentials() (map[string]string, error) {
	data, err := os.ReadFile(s.WorkerCredentialsPath())
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, ioError("read "+s.WorkerCredentialsPath(), err)
	}
	return DecodeWorkerCredentials(data, s.WorkerCredentialsPath())
}

// SetVMCredential records the credential of a worker VM, or with token ""
// forgets it. The file goes when it holds none.
func (s *Store) SetWorkerCredential(id, token string) error {
	s.credsMu.Lock()
	defer s.credsMu.Unlock()
	m, err := s.LoadWorkerCredentials()
	if err != nil {
		return err
	}
	if token == "" {
		if _, ok := m[id]; !ok {
			return nil
		}
		delete(m, id)
	} else {
		if _, ok := m[id]; !ok && len(m) >= maxWorkerCredentials {
			return ioError("write "+s.WorkerCredentialsPath(), fmt.Errorf("it holds %d credentials already", len(m)))
		}
		m[id] = token
	}
	if len(m) == 0 {
		if err := os.Remove(s.WorkerCredentialsPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return ioError("remove "+s.WorkerCredentialsPath(), err)
		}
		return nil
	}
	data, err := json.MarshalIndent(workerCredsFile{Version: workerCredsVersion, Credentials: m}, "", "  ")
	if err != nil {
		return ioError("encode "+s.WorkerCredentialsPath(), err)
	}
	if err := writeAtomic(s.WorkerCredentialsPath(), append(data, '\n'), 0o600); err != nil {
		return ioError("write "+s.WorkerCredentialsPath(), err)
	}
	return nil
}
