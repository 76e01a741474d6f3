package daemon

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/protocol"
)

// Only the queue package of the default registry, a binary run on the
// host, gets the queue provider credential: no other package, registry or
// kind of worker can ask for it.
func TestQueueProviderGrant(t *testing.T) {
	t.Parallel()
	pkg := func(reg, name string) *composefile.Container {
		return &composefile.Container{Key: "q", Source: composefile.Source{Kind: composefile.SourcePackage, Registry: reg, Name: name}}
	}
	info := func(name, typ string) *pkgInfo {
		return &pkgInfo{entry: &lockfile.Entry{Resolved: lockfile.Resolved{Name: name, Type: typ}}}
	}
	for _, tc := range []struct {
		name  string
		decl  *composefile.Container
		pi    *pkgInfo
		grant bool
	}{
		{"queue of the default registry", pkg("", "queue"), info("queue", registry.KindBinary), true},
		{"queue of another registry", pkg("registry.example", "queue"), info("queue", registry.KindBinary), false},
		{"another package of the default registry", pkg("", "state"), info("state", registry.KindBinary), false},
		{"a lock resolving the name to another package", pkg("", "queue"), info("evil", registry.KindBinary), false},
		{"a bundle named queue", pkg("", "queue"), info("queue", registry.KindBundle), false},
		{"a path:// worker", &composefile.Container{Key: "q", Source: composefile.Source{Kind: composefile.SourcePath, Path: "/tmp/queue"}}, nil, false},
		{"no package info", pkg("", "queue"), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Check(t, is.Equal(queueProviderGrant(tc.decl, tc.pi), tc.grant))
		})
	}
}

// The credential names default (the provider's functions) and the
// project's namespace (its deliveries), nothing else.
func TestQueueProviderSpec(t *testing.T) {
	t.Parallel()
	s := queueProviderSpec("orders", "queue", true)
	assert.Check(t, s.QueueProvider && s.Persist)
	assert.Check(t, is.Equal(s.Namespace, protocol.DefaultNamespace))
	assert.Check(t, is.DeepEqual(s.Allow, map[string][]string{"orders": {"*"}}))
	assert.Check(t, s.SandboxHost == nil)
	d := queueProviderSpec(protocol.DefaultNamespace, "queue", false)
	assert.Check(t, d.Allow == nil)
}
