package daemon

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/iii-sandbox/iii/protocol"
)

// credentials are the engine credentials Compose issued for its VM workers,
// by vm_id. A VM worker's connection to the engine carries its credential
// from the host side (the adapter's forward adds it), so the worker may
// register only in its project's namespace and call what is open there and
// in default, never a privileged function; neither the engine token nor the
// project token enters the VM.
type credentials struct {
	byVM map[string]string
	// byProvider are the queue provider credentials, by namespace/key
	// (provider.go).
	byProvider map[string]string
}

// issueVMCredential gives a VM worker about to start its engine
// credential and revokes the one it replaces. It is kept across an engine
// restart (persist) when the engine has a credentials file: the worker's VM
// outlives the engine's adapter process, and the worker reconnects with
// the credential its forward carries. A credential an earlier Compose left
// for this vm_id (worker-credentials.json) is handed over again when its VM
// still runs (the start takes that VM over, and its forward carries that
// credential), and revoked otherwise. Every credential issued is recorded
// there, so that a Compose killed before it could revoke it does not leave
// it valid for good.
func (p *project) issueVMCredential(ctx context.Context, key string, ref *vmRef) (string, error) {
	if tok := p.claimInherited(ref.id); tok != "" {
		if st, err := p.d.vmStatus(ctx, ref); err == nil && !ended(st.State) {
			p.d.log.Info("a VM worker outlived the Compose that started it: its credential is kept", "container", key, "vm_id", ref.id)
			p.d.setVMCredential(ctx, ref.id, tok)
			return tok, nil
		}
		p.d.revokeCredential(ctx, tok)
		p.noteCredential(ref.id, "")
	}
	spec := protocol.CredentialSpec{
		Label:     fmt.Sprintf("compose/%s/%s", p.ns, key),
		Namespace: p.ns,
		Allow:     map[string][]string{protocol.DefaultNamespace: {"*"}},
		Persist:   true,
	}
	raw, err := p.d.eng.Call(ctx, protocol.FnCredentialsIssue, spec)
	if err != nil {
		p.d.log.Warn("the VM worker's credential cannot be kept across an engine restart", "container", key, "error", err)
		spec.Persist = false
		raw, err = p.d.eng.Call(ctx, protocol.FnCredentialsIssue, spec)
	}
	if err != nil {
		return "", fmt.Errorf("issue the worker's engine credential (%s): %w", protocol.FnCredentialsIssue, err)
	}
	var out struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Token == "" {
		return "", fmt.Errorf("%s returned no token", protocol.FnCredentialsIssue)
	}
	p.noteCredential(ref.id, out.Token)
	p.d.setVMCredential(ctx, ref.id, out.Token)
	return out.Token, nil
}

// setVMCredential makes tok the credential of vmID, revoking the one it
// replaces.
func (d *Daemon) setVMCredential(ctx context.Context, vmID, tok string) {
	d.credMu.Lock()
	if d.creds.byVM == nil {
		d.creds.byVM = map[string]string{}
	}
	old := d.creds.byVM[vmID]
	d.creds.byVM[vmID] = tok
	d.credMu.Unlock()
	if old != "" && old != tok {
		d.revokeCredential(ctx, old)
	}
}

// claimInherited takes the credential an earlier Compose left under id.
func (p *project) claimInherited(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	tok := p.inherited[id]
	delete(p.inherited, id)
	return tok
}

// noteVMCredential records (tok "" forgets) vmID's credential in
// worker-credentials.json. A failure is logged: the credential still works,
// it is only not revoked by the next Compose should this one be killed.
func (p *project) noteCredential(vmID, tok string) {
	if err := p.store.SetWorkerCredential(vmID, tok); err != nil {
		p.d.log.Warn("cannot record a VM worker's credential for the next Compose", "vm_id", vmID, "error", err)
	}
}

// forgetVMCredential revokes the credential of a VM worker that stopped
// or was removed, an inherited one too, and forgets it.
func (p *project) forgetVMCredential(ctx context.Context, vmID string) {
	p.d.revokeVMCredential(ctx, vmID)
	if tok := p.claimInherited(vmID); tok != "" {
		p.d.revokeCredential(ctx, tok)
	}
	p.noteCredential(vmID, "")
}

// revokeInherited revokes the credentials an earlier Compose left that no
// start of this one took over (the project stops cleanly: whatever VM
// still carries one belongs to no running Compose).
func (p *project) revokeInherited(ctx context.Context) {
	p.mu.Lock()
	left := p.inherited
	p.inherited = nil
	p.mu.Unlock()
	for id, tok := range left {
		p.d.revokeCredential(ctx, tok)
		p.noteCredential(id, "")
	}
}

// revokeVMCredential revokes the credential of a VM worker that stopped or
// was removed: its connection, if any, is closed.
func (d *Daemon) revokeVMCredential(ctx context.Context, vmID string) {
	d.credMu.Lock()
	tok := d.creds.byVM[vmID]
	delete(d.creds.byVM, vmID)
	d.credMu.Unlock()
	if tok != "" {
		d.revokeCredential(ctx, tok)
	}
}

func (d *Daemon) revokeCredential(ctx context.Context, tok string) {
	if _, err := d.eng.Call(context.WithoutCancel(ctx), protocol.FnCredentialsRevoke, map[string]string{"token": tok}); err != nil {
		d.log.Warn("could not revoke a worker's engine credential", "error", err)
	}
}
