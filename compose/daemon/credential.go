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

// issueVMCredential asks the engine for a credential for one VM worker and
// revokes the one it replaces. It is kept across an engine restart
// (persist) when the engine has a credentials file: the worker's VM
// outlives the engine's adapter process, and the worker reconnects with
// the credential its forward carries.
func (p *project) issueVMCredential(ctx context.Context, key, vmID string) (string, error) {
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
	p.d.credMu.Lock()
	if p.d.creds.byVM == nil {
		p.d.creds.byVM = map[string]string{}
	}
	old := p.d.creds.byVM[vmID]
	p.d.creds.byVM[vmID] = out.Token
	p.d.credMu.Unlock()
	if old != "" {
		p.d.revokeCredential(ctx, old)
	}
	return out.Token, nil
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
