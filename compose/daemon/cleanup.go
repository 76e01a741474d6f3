package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/contract"
)

// CodeVMStateLeft is the code of the warning compose::remove returns when
// a removed VM container's state directory could not be deleted.
const CodeVMStateLeft = "VM_STATE_LEFT"

// defaultWorkersDir is where sandbox-libkrun keeps worker VM state unless
// its configuration sets state_dir.
const defaultWorkersDir = "~/.iii/sandbox/workers"

// vmStateJSON is what became of a removed VM container's state.
type vmStateJSON struct {
	Container string `json:"container"`
	VMID      string `json:"vm_id"`
	Adapter   string `json:"adapter"`
	StateDir  string `json:"state_dir"`
	Removed   bool   `json:"removed"`
}

// warningJSON is a warning a compose::* call returns beside its result.
type warningJSON struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Container string `json:"container,omitempty"`
	Adapter   string `json:"adapter,omitempty"`
	VMID      string `json:"vm_id,omitempty"`
	StateDir  string `json:"state_dir,omitempty"`
}

// removeVMState deletes the state directory of a VM container that was
// taken out of the file (worker::remove). The adapter that holds it must
// run: when it does not, and the file (now) declares it, it is started
// just for the call and stopped again. When the state cannot be deleted
// (the adapter failed to start, is neither declared nor running, the
// engine cannot be reached, or worker::remove failed) the result is a
// warning naming the container, the adapter, the vm_id and where the state
// stays; Compose also prints it. p is the loaded project (nil when none);
// the caller holds its turn.
func (d *Daemon) removeVMState(ctx context.Context, p *project, before, now *composefile.File, key string, ref *vmworkers.Ref) (*vmStateJSON, *warningJSON) {
	out := &vmStateJSON{Container: key, VMID: ref.ID, Adapter: ref.Adapter.Name, StateDir: d.stateDirOf(p, before, ref)}
	warn := func(why string) (*vmStateJSON, *warningJSON) {
		w := &warningJSON{Code: CodeVMStateLeft, Container: key, Adapter: ref.Adapter.Name, VMID: ref.ID, StateDir: out.StateDir,
			Message: fmt.Sprintf("container %q was removed, but the state of its VM (vm_id %s, kept by the sandbox adapter %s) could not be deleted: %s; it stays in %s: delete that directory by hand",
				key, ref.ID, ref.Adapter.Name, why, out.StateDir)}
		d.log.Warn("a removed VM container's state stays", "container", key, "vm_id", ref.ID, "adapter", ref.Adapter.Name, "state_dir", out.StateDir, "why", why)
		fmt.Fprintf(d.out, "compose: warning: %s: %s\n", w.Code, w.Message)
		return out, w
	}
	running, err := d.adapterRunning(ctx, ref.Adapter)
	if err != nil {
		return warn(fmt.Sprintf("the engine could not be reached (%s)", asComposeError(err).Message))
	}
	if !running {
		akey := vmworkers.AdapterKeyIn(now, ref.Adapter.Name)
		if akey == "" || adapterRefIn(now, now.Containers[akey]).NS != ref.Adapter.NS {
			return warn(fmt.Sprintf("%s does not run in namespace %q and %s does not declare it", ref.Adapter.Name, ref.Adapter.NS, now.Path))
		}
		stop, err := d.startAdapterFor(ctx, p, now, akey)
		if err != nil {
			ce := asComposeError(err)
			return warn(fmt.Sprintf("the adapter, started for the clean-up, did not come up (%s: %s)", ce.Code, ce.Message))
		}
		defer stop()
	}
	raw, err := d.vms().Call(ctx, ref.Adapter, contract.OpWorkerRemove, contract.WorkerRemoveRequest{VMID: ref.ID}, adapterStartTimeout)
	if p != nil {
		p.forgetVMCredential(ctx, ref.ID)
	} else {
		d.vmCreds.Forget(ctx, ref.ID)
	}
	if err != nil {
		return warn(fmt.Sprintf("%s::%s failed: %s", ref.Adapter.Name, contract.OpWorkerRemove, vmworkers.ErrorText(err)))
	}
	var rep contract.WorkerRemoveResponse
	if err := json.Unmarshal(raw, &rep); err != nil {
		return warn(fmt.Sprintf("%s::%s returned an unexpected reply: %v", ref.Adapter.Name, contract.OpWorkerRemove, err))
	}
	out.Removed = rep.Removed
	if rep.StateDir != "" {
		out.StateDir = rep.StateDir
	}
	d.log.Info("deleted a removed VM container's state", "container", key, "vm_id", ref.ID, "state_dir", out.StateDir, "removed", rep.Removed)
	return out, nil
}

// adapterRunning reports whether an adapter serves in its namespace: the
// plugin host runs it, or a worker of its name is connected there (an
// adapter may be an ordinary WebSocket worker).
func (d *Daemon) adapterRunning(ctx context.Context, ref *vmworkers.Adapter) (bool, error) {
	st, found, err := adapterState(ctx, d.eng, ref)
	if err != nil {
		return false, engineCallFailed(fnAdaptersList, err)
	}
	if found {
		return st.State == "running", nil
	}
	live, err := listWorkers(ctx, d.eng)
	if err != nil {
		return false, err
	}
	for _, w := range live {
		if w.name() == ref.Name && w.Namespace == ref.NS {
			return true, nil
		}
	}
	return false, nil
}

// startAdapterFor starts the adapter container akey of now for one call,
// loading the project when this daemon does not run it; stop undoes what
// it did. p is the loaded project (its turn held by the caller), or nil.
func (d *Daemon) startAdapterFor(ctx context.Context, p *project, now *composefile.File, akey string) (stop func(), err error) {
	if err := d.checkEngineSection(now); err != nil {
		return nil, err
	}
	loaded := p != nil
	if !loaded {
		if p, err = d.projectFor(now); err != nil {
			return nil, err
		}
		if err := p.acquire(ctx); err != nil {
			return nil, err
		}
	}
	done := func() {
		if !loaded {
			running := p.anyRunning()
			p.release()
			if !running {
				d.unload(p)
			}
		}
	}
	if _, err := p.startOne(ctx, now, akey); err != nil {
		done()
		return nil, err
	}
	return func() {
		p.stopOne(context.WithoutCancel(ctx), p.get(akey), nil)
		done()
	}, nil
}

// stateDirOf is where a VM's state is: what its adapter reported, else
// <state_dir>/workers/<vm_id> of the adapter's state_dir in
// config_override, else ~/.iii/sandbox/workers/<vm_id>.
func (d *Daemon) stateDirOf(p *project, f *composefile.File, ref *vmworkers.Ref) string {
	if p != nil {
		p.mu.Lock()
		sd := ref.StateDir
		p.mu.Unlock()
		if sd != "" {
			return sd
		}
	}
	if ref.AdapterKey != "" && f != nil {
		if c := f.Containers[ref.AdapterKey]; c != nil {
			if sd, ok := c.ConfigOverride["state_dir"].(string); ok && filepath.IsAbs(sd) {
				return filepath.Join(sd, "workers", ref.ID)
			}
		}
	}
	return defaultWorkersDir + "/" + ref.ID + "/"
}

// adapterInUse refuses to take the adapter out of a file whose VM
// containers it boots: they start after it.
func adapterInUse(f *composefile.File, key string, vms []string) error {
	name, ns := vmworkers.AdapterOf(f)
	c := f.Containers[key]
	if c == nil || !c.IsAdapter(name) || adapterRefIn(f, c).NS != ns {
		return nil
	}
	var users []string
	for _, k := range vms {
		if k != key {
			users = append(users, k)
		}
	}
	if len(users) == 0 {
		return nil
	}
	return compose.New(compose.CodeUnknownDependency, fmt.Sprintf(
		"%s: containers %v run in VMs that %s boots, so they start after it; remove them first (their VM state goes with them), then %s; the file was not changed",
		f.Path, users, key, key))
}
