// Package router is the engine's always-on iii-sandbox router. It serves
// the sixteen sandbox::<op> functions in the default namespace and forwards
// each call, payload unchanged, to <adapter>::<op> in the namespace of the
// bound adapter, through the engine's registry. The adapter is whatever
// worker registers those functions there: one the engine's plugin host
// runs as a go-plugin subprocess, or any WebSocket worker (spec iii-0.26
// §7.1; docs/router.md).
//
// The router adds nothing to payloads and passes the adapter's errors
// through as they are. Its own errors are the contract's: S303 when no
// adapter is bound, S301 when the bound adapter is not running (or died
// during the call), S302 when a WebSocket adapter speaks another contract
// major.
package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/schema"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/lazyre"
	"github.com/iii-sandbox/iii/protocol"
)

// WorkerName is the router's internal worker in the default namespace.
const WorkerName = "iii-sandbox"

// CodeInvalidBinding refuses Bind with a bad adapter name or namespace.
const CodeInvalidBinding = "INVALID_SANDBOX_BINDING"

// Binding names the adapter the router forwards to: its worker name (and
// function prefix) and the namespace it runs in.
type Binding struct {
	Adapter   string
	Namespace string
	// Hosts, when set, makes the binding a fleet (fleet.go): "*" for
	// every connected host of the adapter, or host names joined by
	// commas. A string keeps Binding comparable.
	Hosts string
}

// Options configure a Router. Every field is optional.
type Options struct {
	Logger hclog.Logger
	// ConfigBinding returns the binding of config.yaml's top-level
	// sandbox: section, read on every call so the router follows
	// reloads; ok false means the section is absent.
	ConfigBinding func() (b Binding, ok bool)
	// Hosted reports whether the engine's plugin host publishes adapter
	// in namespace. Such an adapter's contract major was checked when it
	// was started, so the router skips its own check.
	Hosted func(adapter, namespace string) bool
	// EngineURL is this engine's worker address, for the S301 hint
	// (`iii compose --up ... --engine <url>`); "" leaves it out.
	EngineURL func() string
	// NotInstalled, when set, says where the engine looked for the bound
	// adapter's binary and found none ("" when it found one or did not
	// look): the S301 hint then leads with installing it.
	NotInstalled func(adapter, namespace string) string
	// Trust is the engine's trust rules (NewTrust), when its assembler
	// made them before the router; nil = New installs them.
	Trust *Trust
}

// Router is the iii-sandbox router. Create it with New; Close detaches it.
type Router struct {
	eng    *engine.Engine
	opts   Options
	log    hclog.Logger
	worker *engine.LocalWorker
	// trust decides whom callers' data may be forwarded to (trust.go).
	trust *Trust

	// explicit is a binding set with Bind; it wins over the config's.
	explicit atomic.Pointer[Binding]

	// checked caches, per bound adapter, the contract check of the
	// worker connection that owns its functions: the check runs once per
	// owner and again when the owner changes.
	mu      sync.Mutex
	checked map[Binding]ownerCheck

	fleet fleetState

	// owned records who created each sandbox (tenancy.go).
	owned owners

	// strays watches for hosts that miss --fleet (stray.go).
	strays strayWatch
}

type ownerCheck struct {
	owner string
	err   *contract.Error // nil: compatible
}

var (
	namespaceRE = lazyre.New(`^[a-z0-9_-]+$`)
)

// New attaches the router to eng and registers sandbox::<op> for every
// operation of the contract.
func New(eng *engine.Engine, opts Options) (*Router, error) {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	trust := opts.Trust
	if trust == nil {
		var err error
		if trust, err = NewTrust(eng); err != nil {
			return nil, err
		}
	}
	r := &Router{eng: eng, opts: opts, log: opts.Logger, trust: trust, checked: map[Binding]ownerCheck{}}
	w, err := eng.AttachLocalWorker(engine.LocalWorkerSpec{
		Name:        WorkerName,
		Namespace:   engine.DefaultNamespace,
		Description: "The sandbox router: serves sandbox::* and forwards each call to the bound adapter.",
		Runtime:     "engine",
		Isolation:   "in-process",
		Internal:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("attach the sandbox router: %w", err)
	}
	for _, op := range append(contract.Ops(), contract.PauseOps()...) {
		def := engine.FunctionDef{
			ID:             contract.RouterFunctionID(op),
			Description:    schema.Description(op) + " Routed to the bound sandbox adapter.",
			RequestSchema:  schema.Request(op),
			ResponseSchema: schema.Response(op),
		}
		if err := w.RegisterFunction(def, r.tenanted(op, r.forward(op))); err != nil {
			w.Detach()
			return nil, fmt.Errorf("register %s: %w", def.ID, err)
		}
	}
	r.worker = w
	r.strays.start(r)
	return r, nil
}

// Close detaches the router; sandbox::* is no longer served.
func (r *Router) Close() {
	r.strays.stop()
	if r.worker != nil {
		r.worker.Detach()
	}
}

// Bind binds the router to adapter in namespace ("" means default),
// overriding config.yaml's sandbox: section until Unbind. Compose uses it
// for the engines it manages.
func (r *Router) Bind(adapter, namespace string) error {
	if namespace == "" {
		namespace = engine.DefaultNamespace
	}
	if !contract.ValidAdapterName(adapter) {
		return &protocol.ErrorBody{Code: CodeInvalidBinding, Message: fmt.Sprintf(
			"sandbox adapter %q is not a worker name: 1 to 64 of a-z 0-9 _ -, starting with a letter or digit", adapter)}
	}
	if !namespaceRE.MatchString(namespace) {
		return &protocol.ErrorBody{Code: protocol.CodeInvalidNamespace, Message: fmt.Sprintf(
			"sandbox namespace %q is not valid: use lower case letters, digits, _ and -", namespace)}
	}
	r.trust.Reserve(adapter)
	r.explicit.Store(&Binding{Adapter: adapter, Namespace: namespace})
	r.log.Info("sandbox router bound", "adapter", adapter, "namespace", namespace)
	return nil
}

// Unbind drops the binding set with Bind; config.yaml's sandbox: section
// (if any) applies again.
func (r *Router) Unbind() {
	if r.explicit.Swap(nil) != nil {
		r.log.Info("sandbox router unbound")
	}
}

// Binding is the binding in force: Bind's, else config.yaml's.
func (r *Router) Binding() (Binding, bool) {
	if b := r.explicit.Load(); b != nil {
		return *b, true
	}
	if r.opts.ConfigBinding != nil {
		if b, ok := r.opts.ConfigBinding(); ok {
			if b.Namespace == "" {
				b.Namespace = engine.DefaultNamespace
			}
			return b, true
		}
	}
	return Binding{}, false
}

func (r *Router) hosted(b Binding) bool {
	return r.opts.Hosted != nil && r.opts.Hosted(b.Adapter, b.Namespace)
}

// forward is the handler of sandbox::<op>.
func (r *Router) forward(op string) engine.Handler {
	return func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		b, ok := r.Binding()
		if !ok {
			return nil, contract.NoAdapterBound().ErrorBody()
		}
		if b.Hosts != "" {
			return r.fleetForward(ctx, b, op, call.Data)
		}
		target := contract.AdapterFunctionID(b.Adapter, op)
		if !r.hosted(b) {
			o := r.trust.OwnerOf(b.Namespace, b.Adapter, target)
			if !o.Registered && contract.IsPauseOp(op) {
				// An adapter that runs but has no pause capability.
				if io := r.trust.OwnerOf(b.Namespace, b.Adapter, contract.AdapterFunctionID(b.Adapter, contract.OpAdapterInfo)); io.Registered && io.Trusted {
					return nil, contract.PauseUnsupported(b.Adapter, op).ErrorBody()
				}
			}
			if o.Registered && !o.Trusted {
				return nil, contract.NewError(contract.S301,
					"%s in namespace %q is registered by a worker that presented neither the engine token nor a sandbox host credential for adapter %q in that namespace; an adapter that is a WebSocket worker must connect with one of them (Authorization: Bearer, docs/security.md), so that no other worker can stand in for it",
					target, b.Namespace, b.Adapter).ErrorBody()
			}
			if serr := r.checkContract(ctx, b, o); serr != nil {
				return nil, serr.ErrorBody()
			}
		}
		out, err := r.eng.Invoke(ctx, b.Namespace, target, call.Data)
		if err == nil {
			// The router calls the adapter as the engine, so the channels
			// the adapter made for this reply (fs::read's content) are
			// still the adapter's: they become the caller's here, within
			// its connection's share, or one caller could fill the
			// adapter's for every other.
			if cerr := r.eng.ChargeReplyChannels(engine.AdapterChannelOwner(b.Namespace, b.Adapter), call, out); cerr != nil {
				return nil, contract.NewError(contract.S218, "sandbox::%s: the channel of its reply: %v", op, cerr).ErrorBody()
			}
			return out, nil
		}
		var eb *protocol.ErrorBody
		if errors.As(err, &eb) {
			switch eb.Code {
			case protocol.CodeFunctionNotFound:
				if contract.IsPauseOp(op) && r.trust.OwnerOf(b.Namespace, b.Adapter, contract.AdapterFunctionID(b.Adapter, contract.OpAdapterInfo)).Registered {
					// The adapter runs but has no pause capability.
					return nil, contract.PauseUnsupported(b.Adapter, op).ErrorBody()
				}
				return nil, r.notRunning(b).ErrorBody()
			case protocol.CodeInvocationStopped:
				return nil, contract.NewError(contract.S301,
					"sandbox adapter %q in namespace %q went away while serving sandbox::%s (%s); retry once it is running again",
					b.Adapter, b.Namespace, op, eb.Message).ErrorBody()
			}
		}
		// The adapter's own errors, and the caller's context ending.
		return nil, err
	}
}

// notRunning is S301 for a bound adapter whose functions are not
// registered in its namespace, with commands that start it as they are
// written: a config.yaml sandbox: block with a configuration (the engine
// then starts the adapter itself), an engine::adapters::start call with
// one, and Compose. Without a configuration an adapter denies every image
// (S100), so each command carries one.
func (r *Router) notRunning(b Binding) *contract.Error {
	engineFlag := ""
	if r.opts.EngineURL != nil {
		if u := r.opts.EngineURL(); u != "" {
			engineFlag = " --engine " + u
		}
	}
	start := fmt.Sprintf(`iii call engine::adapters::start --json '{"adapter":"%s","namespace":"%s","config":%s}'`, b.Adapter, b.Namespace, exampleConfigJSON)
	block := fmt.Sprintf("sandbox: {adapter: %s, namespace: %s, config: %s}", b.Adapter, b.Namespace, exampleConfigYAML)
	compose := fmt.Sprintf("or with Compose: a worker-compose.yaml declaring containers: {%s: {worker: package://%s, config_override: %s}}, then `iii compose --up --namespace %s%s`",
		b.Adapter, b.Adapter, exampleConfigYAML, b.Namespace, engineFlag)
	if r.opts.NotInstalled != nil {
		if where := r.opts.NotInstalled(b.Adapter, b.Namespace); where != "" {
			return contract.NewError(contract.S301,
				"sandbox adapter %q is bound in namespace %q but is not installed: %s. "+
					"Install it (put the %s binary in ~/.iii/plugins/), then start it: `%s` "+
					"(the engine starts it itself, with that configuration, when it starts or config.yaml's %s changes); %s",
				b.Adapter, b.Namespace, where, b.Adapter, start, block, compose)
		}
	}
	return contract.NewError(contract.S301,
		"sandbox adapter %q is bound in namespace %q but is not running there (no %s). "+
			"Start it with its configuration: `%s`, or give config.yaml `%s` and the engine starts it itself; "+
			"if a Compose project runs in namespace %q, add it with `iii call compose::add worker=iii-sandbox`; %s",
		b.Adapter, b.Namespace, contract.AdapterFunctionID(b.Adapter, "*"), start, block, b.Namespace, compose)
}

// The configuration the S301 hints print: the images an adapter admits
// (every adapter built with the SDK reads image_allowlist; without it an
// adapter denies every image, S100).
const (
	exampleConfigJSON = `{"image_allowlist":["python","node"]}`
	exampleConfigYAML = `{image_allowlist: [python, node]}`
)

// checkContract refuses (S302) an adapter, served by a WebSocket worker,
// whose adapter::info reports another contract major. The answer is kept
// per owning worker connection, so the check costs one call per
// connection; a reconnect or another worker taking over checks again.
func (r *Router) checkContract(ctx context.Context, b Binding, o AdapterOwner) *contract.Error {
	if !o.Registered {
		return r.notRunning(b)
	}
	return r.checkOwnerContract(ctx, b, contract.AdapterFunctionID(b.Adapter, contract.OpAdapterInfo), o.WorkerID)
}

// checkOwnerContract is checkContract for the adapter whose adapter::info
// is infoID, served by the worker connection owner; b keys the cache.
func (r *Router) checkOwnerContract(ctx context.Context, b Binding, infoID, owner string) *contract.Error {
	r.mu.Lock()
	c, ok := r.checked[b]
	r.mu.Unlock()
	if ok && c.owner == owner {
		return c.err
	}
	serr, final := r.fetchContract(ctx, b, infoID)
	if final {
		r.mu.Lock()
		r.checked[b] = ownerCheck{owner: owner, err: serr}
		r.mu.Unlock()
		if serr != nil {
			r.log.Warn("sandbox adapter refused", "adapter", b.Adapter, "namespace", b.Namespace, "owner", owner, "reason", serr.Message)
		}
	}
	return serr
}

// fetchContract asks the adapter for its contract. final is false when
// the answer says nothing about the adapter's build (it did not answer),
// so it is not cached.
func (r *Router) fetchContract(ctx context.Context, b Binding, infoID string) (serr *contract.Error, final bool) {
	out, err := r.eng.Invoke(ctx, b.Namespace, infoID, json.RawMessage(`{}`))
	if err != nil {
		var eb *protocol.ErrorBody
		if errors.As(err, &eb) && eb.Code == protocol.CodeFunctionNotFound {
			// Not cached: a worker registers its functions one frame at a
			// time, so a call that arrives between its first operation and
			// its adapter::info (a fleet host reconnecting) would otherwise
			// refuse the whole connection for good.
			return contract.NewError(contract.S302,
				"sandbox adapter %q in namespace %q does not serve %s, so the engine cannot check which sandbox contract it speaks; adapters for contract %d must serve it",
				b.Adapter, b.Namespace, infoID, contract.Major), false
		}
		if ctx.Err() != nil {
			return nil, false
		}
		return contract.NewError(contract.S301, "sandbox adapter %q in namespace %q did not answer %s: %v; retry once it is running again",
			b.Adapter, b.Namespace, infoID, err), false
	}
	var info contract.AdapterInfo
	if err := json.Unmarshal(out, &info); err != nil || info.Contract == (contract.ContractVersion{}) {
		return contract.NewError(contract.S302,
			"sandbox adapter %q in namespace %q reports no readable contract version in %s (want {\"contract\":{\"major\":%d,\"minor\":...}})",
			b.Adapter, b.Namespace, infoID, contract.Major), false
	}
	return contract.CheckContract(b.Adapter, info.Contract), true
}
