// Package vmworkers is Compose's side of worker VMs: registry bundles
// (unless runtime: host) and path:// workers whose iii.worker.yaml sets
// runtime.base_image run in VMs that the sandbox adapter boots through
// <adapter>::worker::* in its namespace (docs/vm-workers.md). The adapter
// owns the VM and its state directory; Compose owns the decision to start,
// watch and stop it. This package names a VM (VMID, Ref), calls the
// adapter (Client), words its failures, and keeps the engine credentials
// Compose issued for VM workers (Credentials). The Compose daemon decides
// when.
package vmworkers

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/contract"
)

// vmIDHashedPrefix is how much of a long vm_id is kept before "-" and 8
// hex digits of its hash: 39 + 1 + 8 = contract.MaxVMIDLen.
const vmIDHashedPrefix = contract.MaxVMIDLen - 9

// Adapter is a sandbox adapter as the engine runs it: its name and the
// namespace it serves.
type Adapter struct {
	Name string
	NS   string
}

// Ref is a container's worker VM: the adapter that runs it and its vm_id.
type Ref struct {
	ID      string
	Adapter *Adapter
	// AdapterKey is the adapter's container in this project; "" when it
	// runs elsewhere (engine.sandbox.namespace names another namespace).
	AdapterKey string
	HostDir    string
	// StateDir is <state_dir>/workers/<vm_id> as the adapter reported it;
	// "" until then. StateDir and Exit change while the project runs:
	// the daemon guards them with the project's lock.
	StateDir string
	// Exit says how the VM's command ended, for WORKER_EXITED.
	Exit string
}

// VMID is the vm_id of a project's VM container: <slug>-<namespace>-<key>,
// lower-cased, with anything outside [a-z0-9._-] turned into '-' and
// leading characters other than a letter or digit dropped; longer than 48
// characters, its first 39, '-' and the first 8 hex digits of the SHA-256
// of the whole. The slug is the project's (state.LocationSlug), so the id is
// stable across runs (the VM's disk is reused) and changes when the project
// directory moves or is renamed, or III_COMPOSE_STATE_DIR changes.
func VMID(composePath, ns, key string, getenv func(string) string) string {
	raw := strings.ToLower(state.LocationSlug(composePath, getenv) + "-" + ns + "-" + key)
	b := []byte(raw)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '.' && c != '_' && c != '-' {
			b[i] = '-'
		}
	}
	id := strings.TrimLeft(string(b), "._-")
	if id == "" {
		id = "project"
	}
	if len(id) > contract.MaxVMIDLen {
		sum := sha256.Sum256([]byte(id))
		id = id[:vmIDHashedPrefix] + "-" + hex.EncodeToString(sum[:])[:8]
	}
	return id
}

// AdapterOf is the adapter that boots f's worker VMs and the namespace it
// runs in: the adapter engine.sandbox binds, else sandbox-libkrun; its
// namespace, else the project's.
func AdapterOf(f *composefile.File) (name, ns string) {
	name, ns = composefile.AdapterPackage, f.Namespace
	if e := f.Engine; e != nil && !e.Empty && e.Sandbox != nil {
		name = e.Sandbox.Adapter
		if e.Sandbox.Namespace != "" {
			ns = e.Sandbox.Namespace
		}
	}
	return name, ns
}

// AdapterKeyIn is the container of f that is the package adapter name
// ("" when f declares none).
func AdapterKeyIn(f *composefile.File, name string) string {
	for _, key := range f.Order {
		if f.Containers[key].IsAdapter(name) {
			return key
		}
	}
	return ""
}
