package daemon

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/protocol"
)

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
func (p *project) issueVMCredential(ctx context.Context, key string, ref *vmworkers.Ref) (string, error) {
	if tok := p.claimInherited(ref.ID); tok != "" {
		if st, err := p.d.vms().Status(ctx, ref); err == nil && !vmworkers.Ended(st.State) {
			p.d.log.Info("a VM worker outlived the Compose that started it: its credential is kept", "container", key, "vm_id", ref.ID)
			p.d.vmCreds.Set(ctx, ref.ID, tok)
			return tok, nil
		}
		p.d.revokeCredential(ctx, tok)
		p.noteCredential(ref.ID, "")
	}
	spec := vmworkers.CredentialSpec(p.ns, key, true)
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
	p.noteCredential(ref.ID, out.Token)
	p.d.vmCreds.Set(ctx, ref.ID, out.Token)
	return out.Token, nil
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
	p.d.vmCreds.Forget(ctx, vmID)
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

// revokeCredential revokes a worker's engine credential (its
// connection, if any, closes); a failure is logged.
func (d *Daemon) revokeCredential(ctx context.Context, tok string) {
	if _, err := d.eng.Call(context.WithoutCancel(ctx), protocol.FnCredentialsRevoke, map[string]string{"token": tok}); err != nil {
		d.log.Warn("could not revoke a worker's engine credential", "error", err)
	}
}
