package vmworkers

import (
	"context"
	"fmt"
	"sync"

	"github.com/iii-sandbox/iii/protocol"
)

// CredentialSpec is the engine credential of a VM worker: a VM worker's
// connection to the engine carries it from the host side (the adapter's
// forward adds it), so the worker may register only in its project's
// namespace and call what is open there and in default, never a
// privileged function; neither the engine token nor the project token
// enters the VM. persist keeps it across an engine restart (the VM
// outlives the engine's adapter process).
func CredentialSpec(ns, key string, persist bool) protocol.CredentialSpec {
	return protocol.CredentialSpec{
		Label:     fmt.Sprintf("compose/%s/%s", ns, key),
		Namespace: ns,
		Allow:     map[string][]string{protocol.DefaultNamespace: {"*"}},
		Persist:   persist,
	}
}

// Credentials are the engine credentials Compose issued for its VM
// workers, by vm_id.
type Credentials struct {
	// Revoke revokes tok at the engine (its connection, if any, closes).
	Revoke func(ctx context.Context, tok string)

	mu   sync.Mutex
	byVM map[string]string
}

// Set makes tok the credential of vmID, revoking the one it replaces.
func (c *Credentials) Set(ctx context.Context, vmID, tok string) {
	c.mu.Lock()
	if c.byVM == nil {
		c.byVM = map[string]string{}
	}
	old := c.byVM[vmID]
	c.byVM[vmID] = tok
	c.mu.Unlock()
	if old != "" && old != tok {
		c.Revoke(ctx, old)
	}
}

// Forget revokes the credential of a VM worker that stopped or was
// removed, and forgets it.
func (c *Credentials) Forget(ctx context.Context, vmID string) {
	c.mu.Lock()
	tok := c.byVM[vmID]
	delete(c.byVM, vmID)
	c.mu.Unlock()
	if tok != "" {
		c.Revoke(ctx, tok)
	}
}
