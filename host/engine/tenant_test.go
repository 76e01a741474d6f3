package engine

import (
	"testing"

	"gotest.tools/v3/assert"
)

// TenantOf names who owns what a call creates: everything for the engine
// token's holder; a credential's label; the anonymous local workers
// together; nobody for a caller that is gone.
func TestTenantOf(t *testing.T) {
	te := startEngine(t, Options{})
	admin := te.dialAdmin(t)
	tok := issue(t, admin, "1", `{"label":"compose/p/api","namespace":"p"}`)
	tok2 := issue(t, admin, "2", `{"label":"compose/p/api","namespace":"p"}`)
	other := issue(t, admin, "3", `{"label":"compose/q/web","namespace":"q"}`)
	anon1, anon2 := te.dial(t), te.dial(t)
	for _, tc := range []struct {
		name   string
		call   *Call
		tenant string
		all    bool
	}{
		{"in-process", &Call{CallerAdmin: true}, "", true},
		{"engine token", &Call{CallerWorkerID: admin.workerID}, "", true},
		{"anonymous", &Call{CallerWorkerID: anon1.workerID}, "anonymous", false},
		{"another anonymous", &Call{CallerWorkerID: anon2.workerID}, "anonymous", false},
		{"credential", &Call{CallerWorkerID: te.dialWith(t, bearerHeader(tok)).workerID}, "credential:compose/p/api", false},
		{"a reissued credential of the label", &Call{CallerWorkerID: te.dialWith(t, bearerHeader(tok2)).workerID}, "credential:compose/p/api", false},
		{"another credential", &Call{CallerWorkerID: te.dialWith(t, bearerHeader(other)).workerID}, "credential:compose/q/web", false},
		{"gone", &Call{CallerWorkerID: "no-such-worker"}, "worker:no-such-worker", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tenant, all := te.TenantOf(tc.call)
			assert.Equal(t, all, tc.all)
			assert.Equal(t, tenant, tc.tenant)
		})
	}
}
