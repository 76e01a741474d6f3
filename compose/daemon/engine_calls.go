package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
)

// engineCaller is what the daemon needs from its engine connection
// (*client.Client).
type engineCaller interface {
	Call(ctx context.Context, functionID string, payload any, opts ...client.CallOption) (json.RawMessage, error)
}

var _ engineCaller = (*client.Client)(nil)

// Engine builtins the daemon calls.
const (
	fnWorkersList     = "engine::workers::list"
	fnWorkersInfo     = "engine::workers::info"
	fnAdaptersStart   = "engine::adapters::start"
	fnAdaptersStop    = "engine::adapters::stop"
	fnAdaptersRestart = "engine::adapters::restart"
	fnAdaptersList    = "engine::adapters::list"
)

// liveWorker is one entry of engine::workers::list.
type liveWorker struct {
	ID            string  `json:"id"`
	Name          *string `json:"name"`
	Namespace     string  `json:"namespace"`
	FunctionCount int     `json:"function_count"`
}

func (w liveWorker) name() string {
	if w.Name == nil {
		return ""
	}
	return *w.Name
}

func listWorkers(ctx context.Context, e engineCaller) ([]liveWorker, error) {
	raw, err := e.Call(ctx, fnWorkersList, map[string]any{})
	if err != nil {
		return nil, engineCallFailed(fnWorkersList, err)
	}
	var out struct {
		Workers []liveWorker `json:"workers"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, engineCallFailed(fnWorkersList, fmt.Errorf("unexpected reply: %v", err))
	}
	return out.Workers, nil
}

// workerPID asks the engine for the pid a worker reported (0 when it
// reported none).
func workerPID(ctx context.Context, e engineCaller, name, ns string) int {
	raw, err := e.Call(ctx, fnWorkersInfo, map[string]any{"name": name, "namespace": ns})
	if err != nil {
		return 0
	}
	var out struct {
		Worker struct {
			PID *int `json:"pid"`
		} `json:"worker"`
	}
	if json.Unmarshal(raw, &out) != nil || out.Worker.PID == nil {
		return 0
	}
	return *out.Worker.PID
}

// inGroup reports whether pid belongs to process group pgid: a worker the
// engine lists came from the process Compose started for a container.
func inGroup(pid, pgid int) bool {
	if pid <= 0 || pgid <= 0 {
		return false
	}
	g, err := syscall.Getpgid(pid)
	return err == nil && g == pgid
}

func engineCallFailed(fn string, err error) error {
	return compose.New(compose.CodeEngineCallFailed, fmt.Sprintf("%s failed: %v", fn, err))
}

// adapterStatus is an engine::adapters::* reply.
type adapterStatus struct {
	Adapter        string `json:"adapter"`
	Namespace      string `json:"namespace"`
	State          string `json:"state"`
	PID            int    `json:"pid"`
	Path           string `json:"path"`
	AdapterVersion string `json:"adapter_version"`
	LastError      string `json:"last_error"`
}

func callTimeout(d time.Duration) client.CallOption { return client.WithTimeout(d) }

// inDefault routes a call to the engine-owned workers of the default
// namespace (configuration::*); the daemon's own namespace may differ.
func inDefault() client.CallOption { return client.WithNamespace("default") }
