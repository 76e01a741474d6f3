package router

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
)

// maxOwned bounds the owner table: past it, a list call forgets the
// sandboxes its reply no longer shows (records made while that list ran
// are kept). Below it nothing is forgotten, so a fleet host that is away
// for a moment does not cost its sandboxes' owners their sandboxes.
const maxOwned = 1 << 16

// owners records which principal created each sandbox the router saw
// created (docs/security.md, "Who sees what"). A sandbox it has no record
// of (created before this engine started, or by the engine token's holder)
// belongs to the engine token's holder only.
type owners struct {
	mu  sync.Mutex
	m   map[string]ownerRecord // sandbox id → its creator
	seq uint64
}

type ownerRecord struct {
	tenant string
	seq    uint64 // when it was recorded
}

func (o *owners) set(id, tenant string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]ownerRecord{}
	}
	o.seq++
	o.m[id] = ownerRecord{tenant: tenant, seq: o.seq}
}

func (o *owners) owner(id string) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec, ok := o.m[id]
	return rec.tenant, ok
}

// mark is the sequence number a list call starts at.
func (o *owners) mark() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seq
}

// prune forgets, when the table is over maxOwned, the sandboxes a list
// reply no longer shows among those recorded before the list began.
func (o *owners) prune(live map[string]bool, before uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.m) <= maxOwned {
		return
	}
	for id, rec := range o.m {
		if !live[id] && rec.seq <= before {
			delete(o.m, id)
		}
	}
}

// tenanted wraps the handler of sandbox::<op> so that a caller other than
// the engine token's holder sees and acts only on the sandboxes it
// created: list shows only those, and every operation naming another's
// sandbox id answers S002 as for a sandbox that does not exist, without
// reaching the adapter. The engine token's holder (and in-process callers)
// see everything, as before.
func (r *Router) tenanted(op string, next engine.Handler) engine.Handler {
	return func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		tenant, all := r.eng.TenantOf(call)
		switch op {
		case contract.OpCreate, contract.OpRun:
			out, err := next(ctx, call)
			if err == nil {
				var created struct {
					SandboxID string `json:"sandbox_id"`
				}
				if json.Unmarshal(out, &created) == nil && created.SandboxID != "" {
					owner := tenant
					if all {
						owner = ""
					}
					r.owned.set(canonicalID(created.SandboxID), owner)
				}
			}
			return out, err
		case contract.OpList:
			before := r.owned.mark()
			out, err := next(ctx, call)
			if err != nil {
				return out, err
			}
			return r.filterList(out, tenant, all, before)
		case contract.OpCatalogList, contract.OpAdapterInfo:
			return next(ctx, call)
		}
		if !all {
			if serr := r.checkOwner(call.Data, tenant); serr != nil {
				return nil, serr.ErrorBody()
			}
		}
		return next(ctx, call)
	}
}

// filterList keeps the caller's own sandboxes of a list reply, and prunes
// the owner table to the sandboxes the reply shows.
func (r *Router) filterList(out json.RawMessage, tenant string, all bool, before uint64) (json.RawMessage, error) {
	var list contract.ListResponse
	if err := json.Unmarshal(out, &list); err != nil {
		if all {
			return out, nil
		}
		return nil, contract.NewError(contract.S300, "the adapter's list reply does not decode: %v", err).ErrorBody()
	}
	live := make(map[string]bool, len(list.Sandboxes))
	for _, s := range list.Sandboxes {
		live[canonicalID(s.SandboxID)] = true
	}
	r.owned.prune(live, before)
	if all {
		return out, nil
	}
	kept := list.Sandboxes[:0]
	for _, s := range list.Sandboxes {
		if owner, ok := r.owned.owner(canonicalID(s.SandboxID)); ok && owner == tenant {
			kept = append(kept, s)
		}
	}
	list.Sandboxes = kept
	b, err := json.Marshal(list)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// checkOwner answers S002 for a request naming a sandbox tenant did not
// create, as the adapter answers for one that does not exist. The id is
// read as the contract reads it (a UUID in any of its forms, canonicalised:
// an adapter treats "ABC…" and "{abc…}" as the same sandbox); one that is
// not a UUID is S001, as the contract says, without reaching the adapter.
// Every key that could be read as sandbox_id is checked, each occurrence
// of it: the contract's decoder takes the exact key's last occurrence, Go
// structs match any case, other SDKs may differ; all must name the
// caller's own sandbox.
func (r *Router) checkOwner(data json.RawMessage, tenant string) *contract.Error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil // not an object: the adapter refuses it (S001)
	}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return contract.NewError(contract.S001, "the request is not valid JSON: %v", err)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return contract.NewError(contract.S001, "the request is not valid JSON: %v", err)
		}
		if k, _ := kt.(string); !strings.EqualFold(k, "sandbox_id") || string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		var s string
		if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return contract.NewError(contract.S001, "field \"sandbox_id\" must be a string")
		}
		id, err := uuid.Parse(s)
		if err != nil {
			return contract.NewError(contract.S001, "sandbox_id is not a valid UUID: %q", truncateID(s))
		}
		if owner, ok := r.owned.owner(id.String()); !ok || owner != tenant {
			return contract.NewError(contract.S002, "sandbox not found: %s", id.String())
		}
	}
	return nil
}

// canonicalID is id's canonical UUID form, or id when it is not one.
func canonicalID(id string) string {
	if u, err := uuid.Parse(id); err == nil {
		return u.String()
	}
	return id
}

func truncateID(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
