package router

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

// A fleet is a binding with Hosts: the adapter runs on several sandbox
// hosts, each a worker that registers its operations as
// <adapter>::host::<host>::<op> (contract.HostFunctionID) in the bound
// namespace, with a sandbox host credential for that host name or the
// engine token (docs/scale-out.md). The router then places creates on the
// host with the most free capacity, sends every call that names a
// sandbox to the host that made it, and merges list over all hosts.
//
// There is no central database: which host holds a sandbox is learned
// when the router places it, and otherwise asked of the hosts (their
// list), so an engine restart or a second engine loses nothing.

// infoMaxAge is how long a host's capacity (adapter::info) is reused.
const infoMaxAge = time.Second

// fleetState is the router's memory of its fleet.
type fleetState struct {
	mu sync.Mutex
	// owner maps a sandbox id to its host.
	owner map[string]string
	// info caches each host's capacity; placed counts creates sent to
	// it since (so a burst spreads before the next info).
	info map[string]hostInfo
}

type hostInfo struct {
	at       time.Time
	free     int64 // free sandbox slots; -1 unknown
	memory   int64 // bytes of memory available; -1 unknown
	placed   int64
	fetching bool
}

// hosts lists the bound adapter's connected hosts that the binding admits
// and the engine trusts for that host name, sorted by name.
func (r *Router) hosts(b Binding) []string {
	prefix := b.Adapter + "::host::"
	seen := map[string]bool{}
	for _, id := range r.eng.FunctionIDs(b.Namespace, prefix) {
		host := contract.HostOfFunctionID(b.Adapter, contract.OpCreate, id)
		if host == "" || seen[host] || !b.admits(host) {
			continue
		}
		o := r.eng.AdapterOwnerOf(b.Namespace, b.Adapter, id)
		// A host credential serves its own host name only.
		if !o.Trusted || (o.Host != "" && o.Host != host) {
			continue
		}
		seen[host] = true
	}
	out := make([]string, 0, len(seen))
	for h := range seen {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// admits reports whether the binding's Hosts include host.
func (b Binding) admits(host string) bool {
	for _, h := range strings.Split(b.Hosts, ",") {
		if h == "*" || h == host {
			return true
		}
	}
	return false
}

// fleetForward serves sandbox::<op> for a fleet binding.
func (r *Router) fleetForward(ctx context.Context, b Binding, op string, data json.RawMessage) (json.RawMessage, error) {
	hosts := r.hosts(b)
	switch op {
	case contract.OpCreate, contract.OpRun:
		if len(hosts) == 0 {
			return nil, r.noHosts(b).ErrorBody()
		}
		host := r.place(ctx, b, hosts)
		out, err := r.invokeHost(ctx, b, host, op, data)
		if err == nil {
			var created struct {
				SandboxID string `json:"sandbox_id"`
			}
			if json.Unmarshal(out, &created) == nil && created.SandboxID != "" && !r.claim(created.SandboxID, host, hosts) {
				return nil, contract.NewError(contract.S300,
					"sandbox host %q of adapter %q answered the create with sandbox id %s, which another connected host holds; the answer is dropped",
					host, b.Adapter, created.SandboxID).ErrorBody()
			}
		}
		return out, err
	case contract.OpList:
		return r.fleetList(ctx, b, hosts)
	case contract.OpCatalogList:
		if len(hosts) == 0 {
			return nil, r.noHosts(b).ErrorBody()
		}
		return r.invokeHost(ctx, b, hosts[0], op, data)
	}
	var named struct {
		SandboxID string `json:"sandbox_id"`
	}
	if err := json.Unmarshal(data, &named); err != nil || named.SandboxID == "" {
		// Let a host word the invalid request as the contract does.
		if len(hosts) == 0 {
			return nil, r.noHosts(b).ErrorBody()
		}
		return r.invokeHost(ctx, b, hosts[0], op, data)
	}
	host, ok := r.ownerOfSandbox(ctx, b, hosts, named.SandboxID)
	if !ok {
		return nil, contract.NewError(contract.S002, "sandbox %s is not on any connected host of sandbox adapter %q (hosts: %s)",
			named.SandboxID, b.Adapter, strings.Join(hosts, ", ")).ErrorBody()
	}
	out, err := r.invokeHost(ctx, b, host, op, data)
	if (err == nil && op == contract.OpStop) || hasCode(err, contract.S002) {
		// Stopped, or gone on its own (idle timeout): the host is asked
		// again should the id come back.
		r.forgetSandbox(named.SandboxID)
	}
	return out, err
}

// hasCode reports whether err is a sandbox error of code as it comes back
// through the engine.
func hasCode(err error, code contract.Code) bool {
	var eb *protocol.ErrorBody
	return errors.As(err, &eb) && eb.Code == string(code)
}

// invokeHost calls host's op; a host that is not connected is S301
// naming it.
func (r *Router) invokeHost(ctx context.Context, b Binding, host, op string, data json.RawMessage) (json.RawMessage, error) {
	id := contract.HostFunctionID(b.Adapter, host, op)
	o := r.eng.AdapterOwnerOf(b.Namespace, b.Adapter, id)
	if !o.Registered {
		return nil, r.hostGone(b, host, op).ErrorBody()
	}
	if !o.Trusted || (o.Host != "" && o.Host != host) {
		return nil, contract.NewError(contract.S301,
			"%s in namespace %q is registered by a worker that is not sandbox host %q of adapter %q (it holds neither the engine token nor that host's credential)",
			id, b.Namespace, host, b.Adapter).ErrorBody()
	}
	// Each host speaks its own contract: checked once per connection,
	// as for a single WebSocket adapter (S302 for another major).
	if op != contract.OpAdapterInfo {
		hb := Binding{Adapter: b.Adapter, Namespace: b.Namespace, Hosts: "@" + host}
		if serr := r.checkOwnerContract(ctx, hb, contract.HostFunctionID(b.Adapter, host, contract.OpAdapterInfo), o.WorkerID); serr != nil {
			return nil, serr.ErrorBody()
		}
	}
	out, err := r.eng.Invoke(ctx, b.Namespace, id, data)
	var eb *protocol.ErrorBody
	if err != nil && errors.As(err, &eb) && (eb.Code == protocol.CodeFunctionNotFound || eb.Code == protocol.CodeInvocationStopped) {
		return nil, r.hostGone(b, host, op).ErrorBody()
	}
	return out, err
}

func (r *Router) hostGone(b Binding, host, op string) *contract.Error {
	return contract.NewError(contract.S301,
		"sandbox host %q of adapter %q (namespace %q) is not connected, so sandbox::%s cannot reach it; its sandboxes answer again if it reconnects with them, new sandboxes go to the other hosts",
		host, b.Adapter, b.Namespace, op)
}

func (r *Router) noHosts(b Binding) *contract.Error {
	url := "<this engine's wss:// url>"
	if r.opts.EngineURL != nil {
		if u := r.opts.EngineURL(); u != "" {
			url = u
		}
	}
	return contract.NewError(contract.S301,
		"no sandbox host of adapter %q is connected in namespace %q (the binding admits hosts %s); start one with `%s serve --engine %s --credential-file <file> --host-name <name> --fleet --config-file <config.json>` (each host with its own name and sandbox host credential, docs/scale-out.md)",
		b.Adapter, b.Namespace, b.Hosts, b.Adapter, url)
}

// fleetList merges every connected host's list.
func (r *Router) fleetList(ctx context.Context, b Binding, hosts []string) (json.RawMessage, error) {
	type result struct {
		host string
		out  json.RawMessage
		err  error
	}
	results := make(chan result, len(hosts))
	for _, h := range hosts {
		go func() {
			out, err := r.invokeHost(ctx, b, h, contract.OpList, json.RawMessage(`{}`))
			results <- result{h, out, err}
		}()
	}
	merged := []json.RawMessage{}
	seen, answered := map[string]bool{}, map[string]bool{}
	for range hosts {
		res := <-results
		if res.err != nil {
			// One host's trouble must not hide the others' sandboxes.
			r.log.Warn("a sandbox host's list failed; listing the others", "host", res.host, "error", res.err.Error())
			continue
		}
		var l struct {
			Sandboxes []json.RawMessage `json:"sandboxes"`
		}
		if err := json.Unmarshal(res.out, &l); err != nil {
			r.log.Warn("a sandbox host's list is not a list", "host", res.host, "error", err.Error())
			continue
		}
		for _, s := range l.Sandboxes {
			var e struct {
				SandboxID string `json:"sandbox_id"`
			}
			if json.Unmarshal(s, &e) == nil && e.SandboxID != "" {
				seen[e.SandboxID] = true
				r.claim(e.SandboxID, res.host, hosts)
			}
		}
		answered[res.host] = true
		merged = append(merged, l.Sandboxes...)
	}
	r.forgetUnlisted(answered, seen)
	return json.Marshal(map[string]any{"sandboxes": merged})
}

// ownerOfSandbox is the host holding sandbox id: remembered, or found in
// the hosts' lists.
func (r *Router) ownerOfSandbox(ctx context.Context, b Binding, hosts []string, id string) (string, bool) {
	r.fleet.mu.Lock()
	host, ok := r.fleet.owner[id]
	r.fleet.mu.Unlock()
	if ok {
		return host, true
	}
	if _, err := r.fleetList(ctx, b, hosts); err != nil {
		return "", false
	}
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	host, ok = r.fleet.owner[id]
	return host, ok
}

// claim records that host holds sandbox id, unless another host among
// the connected ones holds it already: a host cannot take over another's
// sandbox by answering with its id. It reports whether host holds it now.
func (r *Router) claim(id, host string, connected []string) bool {
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	if r.fleet.owner == nil {
		r.fleet.owner = map[string]string{}
	}
	if cur, ok := r.fleet.owner[id]; ok && cur != host && slices.Contains(connected, cur) {
		r.log.Warn("a sandbox host claims a sandbox another connected host holds; ignored", "sandbox_id", id, "host", host, "holder", cur)
		return false
	}
	r.fleet.owner[id] = host
	return true
}

// forgetUnlisted drops what the router remembers of the answering hosts'
// sandboxes that their lists no longer hold (ended on their own), so the
// map does not grow for ever.
func (r *Router) forgetUnlisted(answered, listed map[string]bool) {
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	for id, host := range r.fleet.owner {
		if answered[host] && !listed[id] {
			delete(r.fleet.owner, id)
		}
	}
}

func (r *Router) forgetSandbox(id string) {
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	delete(r.fleet.owner, id)
}

// place picks the host for a create: the most free sandbox slots, then the
// most available memory, then the fewest creates placed since its
// capacity was read, then the name.
func (r *Router) place(ctx context.Context, b Binding, hosts []string) string {
	r.refreshInfo(ctx, b, hosts)
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	best := hosts[0]
	score := func(h string) (int64, int64, int64) {
		in, ok := r.fleet.info[h]
		if !ok {
			return -1, -1, 0
		}
		free := in.free
		if free >= 0 {
			free -= in.placed
		}
		return free, in.memory, -in.placed
	}
	for _, h := range hosts[1:] {
		f1, m1, p1 := score(h)
		f0, m0, p0 := score(best)
		if f1 > f0 || (f1 == f0 && (m1 > m0 || (m1 == m0 && p1 > p0))) {
			best = h
		}
	}
	in := r.fleet.info[best]
	in.placed++
	r.fleet.info[best] = in
	return best
}

// refreshInfo reads adapter::info of the hosts whose capacity is older
// than infoMaxAge, concurrently.
func (r *Router) refreshInfo(ctx context.Context, b Binding, hosts []string) {
	var wg sync.WaitGroup
	now := time.Now()
	r.fleet.mu.Lock()
	if r.fleet.info == nil {
		r.fleet.info = map[string]hostInfo{}
	}
	for _, h := range hosts {
		in, ok := r.fleet.info[h]
		if ok && (now.Sub(in.at) < infoMaxAge || in.fetching) {
			continue
		}
		in.fetching = true
		r.fleet.info[h] = in
		wg.Add(1)
		go func() {
			defer wg.Done()
			fresh := hostInfo{at: time.Now(), free: -1, memory: -1}
			ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if out, err := r.invokeHost(ictx, b, h, contract.OpAdapterInfo, json.RawMessage(`{}`)); err == nil {
				fresh.free, fresh.memory = capacityOf(out)
			}
			r.fleet.mu.Lock()
			r.fleet.info[h] = fresh
			r.fleet.mu.Unlock()
		}()
	}
	r.fleet.mu.Unlock()
	wg.Wait()
}

// capacityOf reads adapter::info's capacity fact (sandboxkit reports it):
// {free_slots, memory_available_bytes}; -1 where absent.
func capacityOf(info json.RawMessage) (free, memory int64) {
	var in struct {
		Capacity struct {
			FreeSlots       *int64 `json:"free_slots"`
			MemoryAvailable *int64 `json:"memory_available_bytes"`
		} `json:"capacity"`
	}
	free, memory = -1, -1
	if json.Unmarshal(info, &in) != nil {
		return
	}
	if p := in.Capacity.FreeSlots; p != nil {
		free = *p
	}
	if p := in.Capacity.MemoryAvailable; p != nil {
		memory = *p
	}
	return
}
