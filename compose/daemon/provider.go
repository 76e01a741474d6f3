package daemon

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/protocol"
)

// The queue provider credential (docs/queues.md, "Who may be the
// provider"). engine::queue::enqueue is reserved to the engine token's
// holder, and Compose gives workers no token; so Compose itself decides
// which container may be the enqueue provider and issues it a narrow
// credential (protocol.CredentialSpec.QueueProvider: it registers only
// engine::queue::enqueue and the engine::queue::* views in default, and
// its deliveries are checked as their enqueuers).
//
// The decision is Compose's, not the package's: no manifest or registry
// field asks for it, so a package cannot. Only a container whose worker
// is `package://queue` of the default registry (the registry the
// operator configured, bin/registry by default), resolved in the lock to
// the binary package `queue` and run as a host process, gets it. A
// package of another registry (package://<host>/queue), a path://
// worker, a bundle and a VM worker never do.

// queuePackage is the package that gets the queue provider credential.
const queuePackage = "queue"

// envQueueProviderToken carries the credential (workers/queue reads it).
const envQueueProviderToken = "III_QUEUE_PROVIDER_TOKEN"

// queueProviderGrant reports whether the container decl, started from the
// package pi as a host process, gets the queue provider credential.
func queueProviderGrant(decl *composefile.Container, pi *pkgInfo) bool {
	return decl != nil && pi != nil && pi.entry != nil &&
		decl.Source.Kind == composefile.SourcePackage && decl.Source.Registry == "" && decl.Source.Name == queuePackage &&
		pi.entry.Resolved.Name == queuePackage && pi.entry.Resolved.Type == registry.KindBinary
}

// queueProviderSpec is the credential's spec: namespace default (where
// the provider's functions live) and the project's namespace, where the
// enqueued calls it delivers run.
func queueProviderSpec(ns, key string, persist bool) protocol.CredentialSpec {
	spec := protocol.CredentialSpec{Label: fmt.Sprintf("compose/%s/%s/queue-provider", ns, key),
		Namespace: protocol.DefaultNamespace, QueueProvider: true, Persist: persist}
	if ns != protocol.DefaultNamespace {
		spec.Allow = map[string][]string{ns: {"*"}}
	}
	return spec
}

// issueQueueProviderCredential issues the container's credential and
// revokes the one it replaces. It is kept across an engine restart
// (persist) when the engine has a credentials file.
func (p *project) issueQueueProviderCredential(ctx context.Context, key string) (string, error) {
	raw, err := p.d.eng.Call(ctx, protocol.FnCredentialsIssue, queueProviderSpec(p.ns, key, true))
	if err != nil {
		p.d.log.Warn("the queue provider credential cannot be kept across an engine restart", "container", key, "error", err)
		raw, err = p.d.eng.Call(ctx, protocol.FnCredentialsIssue, queueProviderSpec(p.ns, key, false))
	}
	if err != nil {
		return "", fmt.Errorf("issue the queue provider credential of %q (%s): %w", key, protocol.FnCredentialsIssue, err)
	}
	var out struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Token == "" {
		return "", fmt.Errorf("%s returned no token", protocol.FnCredentialsIssue)
	}
	// The process an earlier Compose gave a credential to is gone: this
	// container starts a new one.
	if old := p.claimInherited(providerCredID(key)); old != "" {
		p.d.revokeCredential(ctx, old)
	}
	p.noteCredential(providerCredID(key), out.Token)
	ref := p.ns + "/" + key
	p.d.credMu.Lock()
	if p.d.providerCreds == nil {
		p.d.providerCreds = map[string]string{}
	}
	old := p.d.providerCreds[ref]
	p.d.providerCreds[ref] = out.Token
	p.d.credMu.Unlock()
	if old != "" {
		p.d.revokeCredential(ctx, old)
	}
	return out.Token, nil
}

// revokeQueueProviderCredential revokes the credential of a container
// that stopped (its connections close).
func (p *project) revokeQueueProviderCredential(ctx context.Context, key string) {
	ref := p.ns + "/" + key
	p.d.credMu.Lock()
	tok := p.d.providerCreds[ref]
	delete(p.d.providerCreds, ref)
	p.d.credMu.Unlock()
	if tok != "" {
		p.d.revokeCredential(ctx, tok)
	}
	// A provider adopted from a crashed Compose carries the credential
	// that Compose issued.
	if old := p.claimInherited(providerCredID(key)); old != "" {
		p.d.revokeCredential(ctx, old)
	}
	p.noteCredential(providerCredID(key), "")
}

// providerCredID names a queue provider container's credential in
// worker-credentials.json (a vm_id never holds a slash).
func providerCredID(key string) string { return "queue-provider/" + key }
