package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/iii-sandbox/iii/compose"
)

// Container states, as compose::status and operation results report them.
const (
	StatusStarting = "starting"
	StatusReady    = "ready"
	StatusFailed   = "failed"
	StatusStopped  = "stopped"
)

// stateVersion is the state.json format.
const stateVersion = 1

// State is state.json: the processes a Compose started for one project.
type State struct {
	Version     int                `json:"version"`
	ComposePath string             `json:"compose_path"`
	DaemonPID   int                `json:"daemon_pid,omitempty"`
	Containers  map[string]*Record `json:"containers"`
}

// Record is one container's process.
type Record struct {
	PID       int          `json:"pid,omitempty"`
	Birth     string       `json:"birth,omitempty"`
	Status    string       `json:"status"`
	StartedAt *time.Time   `json:"started_at,omitempty"`
	LastError *ErrorRecord `json:"last_error,omitempty"`
}

// ErrorRecord is a container's last failure.
type ErrorRecord struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// NewState is an empty state for the compose file at composePath.
func NewState(composePath string) *State {
	return &State{Version: stateVersion, ComposePath: composePath, Containers: map[string]*Record{}}
}

// Decode reads state.json. Anything it cannot trust is INVALID_STATE_FILE:
// a record that names the wrong process would make Compose signal a
// stranger.
func Decode(data []byte, path string) (*State, error) {
	bad := func(format string, args ...any) error {
		return compose.New(compose.CodeInvalidStateFile, fmt.Sprintf("%s: %s; stop every process it lists (compose::status shows them) and delete the file",
			path, fmt.Sprintf(format, args...)))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var st State
	if err := dec.Decode(&st); err != nil {
		return nil, bad("not a Compose state file (%v)", err)
	}
	if dec.More() {
		return nil, bad("trailing data after the state object")
	}
	if st.Version != stateVersion {
		return nil, bad("version %d is not supported (this Compose writes version %d)", st.Version, stateVersion)
	}
	if st.ComposePath == "" {
		return nil, bad("compose_path is missing")
	}
	if st.Containers == nil {
		st.Containers = map[string]*Record{}
	}
	for key, r := range st.Containers {
		if r == nil {
			return nil, bad("container %q has no record", key)
		}
		switch r.Status {
		case StatusStarting, StatusReady, StatusFailed, StatusStopped:
		default:
			return nil, bad("container %q has status %q", key, r.Status)
		}
		if r.PID < 0 || r.PID == 1 {
			return nil, bad("container %q has pid %d", key, r.PID)
		}
	}
	return &st, nil
}

// newInvalid is INVALID_STATE_FILE for a file of the state directory.
func newInvalid(path, what string) error {
	return compose.New(compose.CodeInvalidStateFile, path+": "+what)
}

// Encode is the inverse of Decode.
func (s *State) Encode() ([]byte, error) {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}
