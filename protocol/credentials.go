package protocol

// The names and request shape below are part of what a worker sends the
// engine, not of the engine's insides: Compose issues its workers' narrow
// credentials with them, and it must not import host/engine to do so
// (docs/architecture.md, "Layers"). host/engine aliases them.

// Credential builtins: privileged, so only the engine token's holder
// (Compose, the local user) hands out narrow credentials.
const (
	FnCredentialsIssue  = "engine::credentials::issue"
	FnCredentialsRevoke = "engine::credentials::revoke"
)

// CredentialSpec is what a scoped credential allows: the request of
// engine::credentials::issue.
type CredentialSpec struct {
	// Label names the credential in logs and engine::workers::info, e.g.
	// "compose/orders/worker-a".
	Label string `json:"label"`
	// Namespace is the only namespace the holder may declare and register
	// in; every function there is callable.
	Namespace string `json:"namespace"`
	// Allow lists further grants, as auth functions return them:
	// namespace → exact ids or wildcards.
	Allow map[string][]string `json:"allow,omitempty"`
	// SandboxHost makes it a sandbox host credential: its holder may
	// register only <adapter>::* in Namespace, and the sandbox router
	// trusts what it registers as that adapter (docs/security.md).
	SandboxHost *SandboxHostSpec `json:"sandbox_host,omitempty"`
	// QueueProvider makes it a queue provider credential (Compose gives
	// one to the queue package of its default registry): Namespace must
	// be default, and its holder may register QueueProviderFunctions there
	// and nothing else, nor trigger types or triggers.
	QueueProvider bool `json:"queue_provider,omitempty"`
	// Persist keeps the credential (its token's sha256 and this spec,
	// never the token) in the engine's credentials file, so it survives
	// a restart of the engine.
	Persist bool `json:"persist,omitempty"`
}

// SandboxHostSpec names the adapter a remote sandbox host serves and the
// host itself.
type SandboxHostSpec struct {
	// Adapter is the adapter's name: its function prefix, as the sandbox
	// router binds it.
	Adapter string `json:"adapter"`
	// HostName names the host, 1 to 63 of a-z 0-9 -.
	HostName string `json:"host_name"`
}
