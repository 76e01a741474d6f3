package router

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// A host started without --fleet under a fleet binding registers
// <adapter>::<op>, the functions of a single adapter, instead of
// <adapter>::host::<name>::<op>: it says "connected to the engine;
// serving" and the router never uses it. The router looks for such a
// stray and says so: a warning in the engine's log (once per worker
// connection), Warnings (engine::adapters::list shows them) and the S301
// a fleet without hosts answers.

// strayCheckInterval is how often the router looks for a stray while the
// binding is a fleet: one registry lookup, so a stray is logged within
// about a second of connecting even if nobody calls sandbox::*.
const strayCheckInterval = time.Second

// strayWatch is the router's stray detector.
type strayWatch struct {
	mu sync.Mutex
	// warned is the worker connection last logged as a stray: one log
	// line per connection, whatever calls and checks follow (one string,
	// so nothing grows).
	warned string

	cancel context.CancelFunc
	done   chan struct{}
}

func (s *strayWatch) start(r *Router) {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTicker(strayCheckInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.strayWarning()
			}
		}
	}()
}

func (s *strayWatch) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
}

// Warnings lists what the engine operator should fix in the sandbox
// binding now: a host that serves a fleet-bound adapter without --fleet.
// engine::adapters::list shows them.
func (r *Router) Warnings() []string {
	if w := r.strayWarning(); w != "" {
		return []string{w}
	}
	return nil
}

// strayWarning is the warning about a worker that serves the fleet-bound
// adapter's <adapter>::<op> functions ("" when there is none), logged
// once per worker connection.
func (r *Router) strayWarning() string {
	b, ok := r.Binding()
	if !ok || b.Hosts == "" {
		return ""
	}
	id := contract.AdapterFunctionID(b.Adapter, contract.OpAdapterInfo)
	o := r.trust.OwnerOf(b.Namespace, b.Adapter, id)
	if !o.Registered {
		id = contract.AdapterFunctionID(b.Adapter, contract.OpCreate)
		if o = r.trust.OwnerOf(b.Namespace, b.Adapter, id); !o.Registered {
			return ""
		}
	}
	who := "a worker"
	name := "<name>"
	if o.Host != "" {
		who, name = fmt.Sprintf("sandbox host %q", o.Host), o.Host
	}
	msg := fmt.Sprintf("sandbox adapter %q is bound as a fleet in namespace %q (hosts %s), but %s (worker %s) serves %s::* there without --fleet, "+
		"so the router never uses it: restart it with `--fleet --host-name %s` (it then registers %s; docs/scale-out.md)",
		b.Adapter, b.Namespace, b.Hosts, who, o.WorkerID, b.Adapter, name, contract.HostFunctionID(b.Adapter, name, "*"))
	r.strays.mu.Lock()
	first := r.strays.warned != o.WorkerID
	r.strays.warned = o.WorkerID
	r.strays.mu.Unlock()
	if first {
		r.log.Warn("a sandbox host serves a fleet-bound adapter without --fleet; the router never uses it",
			"adapter", b.Adapter, "namespace", b.Namespace, "worker_id", o.WorkerID, "host_name", o.Host, "function", id, "fix", "restart it with --fleet --host-name "+name)
	}
	return msg
}
