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
	// owner maps a sandbox id to its host, and the host's adapter
	// instance that held it.
	owner map[string]sandboxHome
	// info caches each host's capacity; placed counts creates sent to
	// it since (so a burst spreads before the next info).
	info map[string]hostInfo
	// instances caches each host's adapter instance (sdk.InstanceFactKey
	// of its adapter::info), per worker connection.
	instances map[string]hostInstance
	// lost remembers sandboxes whose host restarted (lostMax at most).
	lost lostSandboxes
}

// sandboxHome is where a sandbox lives: its host, and the instance id of
// the adapter process that held it ("" when the host reports none).
type sandboxHome struct {
	host, instance string
}

// hostInstance is the adapter instance a host's worker connection served.
type hostInstance struct {
	worker, instance string
}

// lostMax bounds how many sandboxes lost to host restarts the router
// remembers, oldest forgotten first: an id is only remembered when the
// router knew it already (it placed it, or a trusted host listed it), and
// never more than this many, whatever callers or hosts do.
const lostMax = 4096

// lostSandboxes is a bounded first-in first-out set of sandbox ids lost
// when their host's adapter process restarted, with that host.
type lostSandboxes struct {
	host  map[string]string
	order []string
}

func (l *lostSandboxes) add(id, host string) {
	if l.host == nil {
		l.host = map[string]string{}
	}
	if _, ok := l.host[id]; ok {
		l.host[id] = host
		return
	}
	for len(l.order) >= lostMax {
		delete(l.host, l.order[0])
		l.order = l.order[1:]
	}
	l.host[id] = host
	l.order = append(l.order, id)
}

func (l *lostSandboxes) get(id string) (string, bool) {
	h, ok := l.host[id]
	return h, ok
}

// remove forgets id (it is live again: a host lists it). The order keeps
// it until it reaches the front; add and the bound stay correct since
// deleting a missing key does nothing.
func (l *lostSandboxes) remove(id string) { delete(l.host, id) }

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
		o := r.trust.OwnerOf(b.Namespace, b.Adapter, id)
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
			if json.Unmarshal(out, &created) == nil && created.SandboxID != "" && !r.claim(created.SandboxID, host, r.instanceOf(ctx, b, host), hosts) {
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
	home, ok := r.ownerOfSandbox(ctx, b, hosts, named.SandboxID)
	if !ok {
		if host, lost := r.lostTo(named.SandboxID); lost {
			return nil, lostWithHost(named.SandboxID, host, b).ErrorBody()
		}
		return nil, contract.NewError(contract.S002, "sandbox %s is not on any connected host of sandbox adapter %q (hosts: %s)",
			named.SandboxID, b.Adapter, strings.Join(hosts, ", ")).ErrorBody()
	}
	out, err := r.invokeHost(ctx, b, home.host, op, data)
	if hasCode(err, contract.S002) && home.instance != "" {
		// The host does not know it: if another adapter process serves
		// the host now, the sandbox died with the one that held it.
		if cur := r.instanceOf(ctx, b, home.host); cur != "" && cur != home.instance {
			r.forgetSandbox(named.SandboxID)
			r.markLost(named.SandboxID, home.host)
			return nil, lostWithHost(named.SandboxID, home.host, b).ErrorBody()
		}
	}
	if (err == nil && op == contract.OpStop) || hasCode(err, contract.S002) {
		// Stopped, or gone on its own (idle timeout): the host is asked
		// again should the id come back.
		r.forgetSandbox(named.SandboxID)
	}
	return out, err
}

// lostWithHost is S002 for a sandbox whose host's adapter process
// restarted since it held it: the sandbox (its VM, its files) ended with
// that process.
func lostWithHost(id, host string, b Binding) *contract.Error {
	return contract.NewError(contract.S002,
		"sandbox %s was on sandbox host %q of adapter %q, whose adapter process restarted since (the host reconnected as a new instance): "+
			"the sandbox was lost with the old process, as every sandbox of a host whose adapter restarts is (docs/scale-out.md, \"When a host is lost\")",
		id, host, b.Adapter).WithFixNote("the sandbox is gone for good: call sandbox::create for a new one and use the sandbox_id it returns")
}

// instanceOf is the adapter instance id host's connection reports in its
// adapter::info (sdk.InstanceFactKey), asked once per worker connection;
// "" when the host is not connected or reports none.
func (r *Router) instanceOf(ctx context.Context, b Binding, host string) string {
	o := r.trust.OwnerOf(b.Namespace, b.Adapter, contract.HostFunctionID(b.Adapter, host, contract.OpAdapterInfo))
	if !o.Registered {
		return ""
	}
	r.fleet.mu.Lock()
	c, ok := r.fleet.instances[host]
	r.fleet.mu.Unlock()
	if ok && c.worker == o.WorkerID {
		return c.instance
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := r.invokeHost(ictx, b, host, contract.OpAdapterInfo, json.RawMessage(`{}`))
	if err != nil {
		return ""
	}
	inst := instanceFact(out)
	r.noteInstance(host, o.WorkerID, inst)
	return inst
}

// noteInstance records the instance id host's worker connection reported.
func (r *Router) noteInstance(host, worker, instance string) {
	if worker == "" {
		return
	}
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	if r.fleet.instances == nil {
		r.fleet.instances = map[string]hostInstance{}
	}
	r.fleet.instances[host] = hostInstance{worker: worker, instance: instance}
}

// instanceFact reads adapter::info's instance id ("" when absent).
func instanceFact(info json.RawMessage) string {
	var in struct {
		Instance string `json:"instance_id"`
	}
	if json.Unmarshal(info, &in) != nil || len(in.Instance) > 128 {
		return ""
	}
	return in.Instance
}

func (r *Router) markLost(id, host string) {
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	r.fleet.lost.add(id, host)
}

// lostTo reports the host a sandbox was lost with when its adapter
// process restarted.
func (r *Router) lostTo(id string) (string, bool) {
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	return r.fleet.lost.get(id)
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
	o := r.trust.OwnerOf(b.Namespace, b.Adapter, id)
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
	e := contract.NewError(contract.S301,
		"no sandbox host of adapter %q is connected in namespace %q (the binding admits hosts %s); start one with `%s serve --engine %s --credential-file <file> --host-name <name> --fleet --config-file <config.json>` (each host with its own name and sandbox host credential, docs/scale-out.md)",
		b.Adapter, b.Namespace, b.Hosts, b.Adapter, url)
	if w := r.strayWarning(); w != "" {
		e.Message += ". Note: " + w
	}
	return e
}

// fleetList merges every connected host's list.
func (r *Router) fleetList(ctx context.Context, b Binding, hosts []string) (json.RawMessage, error) {
	type result struct {
		host, instance string
		out            json.RawMessage
		err            error
	}
	results := make(chan result, len(hosts))
	for _, h := range hosts {
		go func() {
			out, err := r.invokeHost(ctx, b, h, contract.OpList, json.RawMessage(`{}`))
			var inst string
			if err == nil {
				inst = r.instanceOf(ctx, b, h)
			}
			results <- result{h, inst, out, err}
		}()
	}
	merged := []json.RawMessage{}
	seen, answered := map[string]bool{}, map[string]string{}
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
		hostName, _ := json.Marshal(res.host)
		for _, s := range l.Sandboxes {
			var e map[string]json.RawMessage
			if json.Unmarshal(s, &e) != nil || e == nil {
				r.log.Warn("a sandbox host's list holds an entry that is not an object; left out", "host", res.host)
				continue
			}
			var id string
			if json.Unmarshal(e["sandbox_id"], &id) == nil && id != "" {
				seen[id] = true
				r.claim(id, res.host, res.instance, hosts)
			}
			// Which host holds it: the name the router reaches it by,
			// whatever the host wrote there itself.
			e["host_name"] = hostName
			entry, err := json.Marshal(e)
			if err != nil {
				continue
			}
			merged = append(merged, entry)
		}
		answered[res.host] = res.instance
	}
	r.forgetUnlisted(answered, seen)
	return json.Marshal(map[string]any{"sandboxes": merged})
}

// ownerOfSandbox is where sandbox id lives: remembered, or found in the
// hosts' lists.
func (r *Router) ownerOfSandbox(ctx context.Context, b Binding, hosts []string, id string) (sandboxHome, bool) {
	r.fleet.mu.Lock()
	home, ok := r.fleet.owner[id]
	r.fleet.mu.Unlock()
	if ok {
		return home, true
	}
	if _, err := r.fleetList(ctx, b, hosts); err != nil {
		return sandboxHome{}, false
	}
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	home, ok = r.fleet.owner[id]
	return home, ok
}

// claim records that host (its adapter instance) holds sandbox id, unless
// another host among the connected ones holds it already: a host cannot
// take over another's sandbox by answering with its id. It reports
// whether host holds it now.
func (r *Router) claim(id, host, instance string, connected []string) bool {
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	if r.fleet.owner == nil {
		r.fleet.owner = map[string]sandboxHome{}
	}
	if cur, ok := r.fleet.owner[id]; ok && cur.host != host && slices.Contains(connected, cur.host) {
		r.log.Warn("a sandbox host claims a sandbox another connected host holds; ignored", "sandbox_id", id, "host", host, "holder", cur.host)
		return false
	}
	r.fleet.owner[id] = sandboxHome{host: host, instance: instance}
	r.fleet.lost.remove(id)
	return true
}

// forgetUnlisted drops what the router remembers of the answering hosts'
// sandboxes that their lists no longer hold (ended on their own), so the
// map does not grow for ever. answered maps each host that answered to
// its adapter instance: a sandbox an earlier instance held is remembered
// as lost with the host's restart (bounded, lostMax).
func (r *Router) forgetUnlisted(answered map[string]string, listed map[string]bool) {
	r.fleet.mu.Lock()
	defer r.fleet.mu.Unlock()
	for id, home := range r.fleet.owner {
		cur, ok := answered[home.host]
		if !ok || listed[id] {
			continue
		}
		if home.instance != "" && cur != "" && cur != home.instance {
			r.fleet.lost.add(id, home.host)
		}
		delete(r.fleet.owner, id)
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
			o := r.trust.OwnerOf(b.Namespace, b.Adapter, contract.HostFunctionID(b.Adapter, h, contract.OpAdapterInfo))
			if out, err := r.invokeHost(ictx, b, h, contract.OpAdapterInfo, json.RawMessage(`{}`)); err == nil {
				fresh.free, fresh.memory = capacityOf(out)
				if o2 := r.trust.OwnerOf(b.Namespace, b.Adapter, contract.HostFunctionID(b.Adapter, h, contract.OpAdapterInfo)); o2.WorkerID == o.WorkerID {
					// The same connection before and after: its answer.
					r.noteInstance(h, o.WorkerID, instanceFact(out))
				}
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
