package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	"github.com/iii-sandbox/iii/contract/schema"
	"github.com/iii-sandbox/iii/internal/ownfile"
	"github.com/iii-sandbox/iii/internal/taskgroup"
	"github.com/iii-sandbox/iii/protocol"
)

// Environment variables of the WebSocket transport (docs/remote-adapters.md).
// Each is the default of the flag of the same meaning.
const (
	// EnvEngineURL is --engine: the engine's ws:// or wss:// address. When
	// it is set (or --engine is given) Serve connects to the engine as a
	// worker instead of speaking go-plugin.
	EnvEngineURL = "III_ADAPTER_ENGINE_URL"
	// EnvCredentialFile is --credential-file: a file holding the bearer
	// token the adapter presents.
	EnvCredentialFile = "III_ADAPTER_CREDENTIAL_FILE"
	// EnvNamespace is --namespace (default "default").
	EnvNamespace = "III_ADAPTER_NAMESPACE"
	// EnvHostName is --host-name, reported in adapter::info's facts as
	// HostNameFactKey.
	EnvHostName = "III_ADAPTER_HOST_NAME"
	// EnvConfigFile is --config-file: the adapter's configuration (a JSON
	// object), applied before the adapter connects.
	EnvConfigFile = "III_ADAPTER_CONFIG_FILE"
	// EnvFleet is --fleet ("1" or "true"): serve as one host of a fleet
	// (docs/scale-out.md), registering <adapter>::host::<host>::<op>.
	EnvFleet = "III_ADAPTER_FLEET"
)

// HostNameFactKey is the adapter::info fact naming the host a remote
// adapter runs on (--host-name).
const HostNameFactKey = "host_name"

// ExitAuthRejected: the engine refused the credential (AUTH_ERROR). 77 is
// EX_NOPERM from sysexits.h. A remote adapter does not retry a refused
// credential: a new one needs a restart anyway.
const ExitAuthRejected = 77

// RemoteOptions is how a remote adapter reaches its engine.
type RemoteOptions struct {
	EngineURL      string
	CredentialFile string
	Namespace      string
	HostName       string
	ConfigFile     string
	// Fleet registers every operation as one host of a fleet,
	// contract.HostFunctionID(adapter, HostName, op), so several hosts of
	// the same adapter share a namespace and the router places sandboxes
	// over them; without it the adapter registers <adapter>::<op>, the
	// single adapter of a binding. Needs HostName.
	Fleet bool

	// Reconnect delays: the first (default 500 ms), doubling up to Max
	// (default 30 s).
	ReconnectInitial, ReconnectMax time.Duration
}

// remoteArgs reads the transport's flags (after an optional leading
// "serve") with the environment as defaults. ok is false when neither
// --engine nor EnvEngineURL nor "serve" asks for the WebSocket transport.
func remoteArgs(args []string, getenv func(string) string) (o RemoteOptions, ok bool, err error) {
	explicit := len(args) > 0 && args[0] == "serve"
	if explicit {
		args = args[1:]
	}
	wants := explicit || getenv(EnvEngineURL) != ""
	for _, a := range args {
		if a == "--engine" || a == "-engine" || strings.HasPrefix(a, "--engine=") || strings.HasPrefix(a, "-engine=") {
			wants = true
		}
	}
	if !wants {
		return o, false, nil
	}
	fs := serveFlags(&o, getenv)
	if err := fs.Parse(args); err != nil {
		return o, true, err
	}
	if fs.NArg() > 0 {
		return o, true, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case o.EngineURL == "":
		return o, true, fmt.Errorf("--engine (or %s) is required: the engine's ws:// or wss:// address", EnvEngineURL)
	case o.CredentialFile == "":
		return o, true, fmt.Errorf("--credential-file (or %s) is required: a file holding the token the engine accepts", EnvCredentialFile)
	case !client.ValidNamespace(o.Namespace):
		return o, true, fmt.Errorf("--namespace %q is invalid: use lowercase letters, digits, '-' and '_'", o.Namespace)
	case o.HostName != "" && !hostNameRE.MatchString(o.HostName):
		return o, true, fmt.Errorf("--host-name %q is not a host name: 1 to 63 of a-z 0-9 - (as a sandbox host credential names it)", o.HostName)
	case o.Fleet && o.HostName == "":
		return o, true, fmt.Errorf("--fleet needs --host-name (or %s): a fleet's hosts are told apart by name", EnvHostName)
	}
	u, err := url.Parse(o.EngineURL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return o, true, fmt.Errorf("--engine %q must be a ws:// or wss:// address with a host", o.EngineURL)
	}
	return o, true, nil
}

// serveFlags is the flag set of `serve`, each flag defaulting to its
// environment variable; serveHelp prints it.
func serveFlags(o *RemoteOptions, getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.EngineURL, "engine", getenv(EnvEngineURL),
		"the engine's ws:// or wss:// address (wss:// beyond loopback), e.g. wss://engine.example:49134; required")
	fs.StringVar(&o.CredentialFile, "credential-file", getenv(EnvCredentialFile),
		"a file (mode 0600) holding the token the engine accepts: a sandbox host credential from engine::credentials::issue, or the engine token; required")
	fs.StringVar(&o.Namespace, "namespace", or(getenv(EnvNamespace), "default"),
		"the namespace the adapter registers its functions in: the namespace config.yaml's sandbox: section binds")
	fs.StringVar(&o.HostName, "host-name", getenv(EnvHostName),
		"this host's name (a-z 0-9 -, at most 63), the host_name of its sandbox host credential; reported in adapter::info")
	fs.StringVar(&o.ConfigFile, "config-file", getenv(EnvConfigFile),
		"the adapter's configuration as a JSON object (image_allowlist, ...), applied before it connects")
	envFleet := getenv(EnvFleet)
	fs.BoolVar(&o.Fleet, "fleet", envFleet == "1" || envFleet == "true",
		"serve as one host of a fleet (config.yaml sandbox: {hosts: ...}, docs/scale-out.md): register <adapter>::host::<host-name>::<op>; needs --host-name. Without it a fleet binding never uses this host")
	return fs
}

// serveEnv names each serve flag's environment variable.
var serveEnv = map[string]string{
	"engine": EnvEngineURL, "credential-file": EnvCredentialFile, "namespace": EnvNamespace,
	"host-name": EnvHostName, "config-file": EnvConfigFile, "fleet": EnvFleet,
}

// serveArg names each valued serve flag's argument in the help.
var serveArg = map[string]string{
	"engine": "URL", "credential-file": "FILE", "namespace": "NS", "host-name": "NAME", "config-file": "FILE",
}

// serveHelp is `serve --help`: what serve does and every flag with its
// description and environment variable.
func serveHelp(cfg ServeConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage:\n%s\n", remoteUsage(cfg.Name))
	fmt.Fprintf(&b, "Runs %s on this machine as a worker of an iii engine, over WebSocket (docs/remote-adapters.md).\n", cfg.Name)
	b.WriteString("Alone, it serves the engine's sandbox: binding of this adapter. As one host of a fleet\n")
	b.WriteString("(config.yaml sandbox: {adapter: " + cfg.Name + ", hosts: \"*\"}, docs/scale-out.md) start every host\n")
	b.WriteString("with --fleet and its own --host-name:\n\n")
	fmt.Fprintf(&b, "    %s serve --engine wss://ENGINE:49134 --credential-file FILE --host-name h1 --fleet --config-file CONFIG.json\n\n", cfg.Name)
	fmt.Fprintf(&b, "CONFIG.json is the adapter's configuration, e.g. %s\n\n", exampleConfigJSON(cfg))
	b.WriteString("Flags (each defaults to its environment variable):\n")
	var o RemoteOptions
	fs := serveFlags(&o, func(string) string { return "" })
	fs.VisitAll(func(f *flag.Flag) {
		arg := ""
		if a := serveArg[f.Name]; a != "" {
			arg = " " + a
		}
		fmt.Fprintf(&b, "  --%s%s\n        %s (%s", f.Name, arg, f.Usage, serveEnv[f.Name])
		if f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(&b, "; default %s", f.DefValue)
		}
		b.WriteString(")\n")
	})
	b.WriteString("  --help\n        print this help\n")
	return b.String()
}

// hostNameRE is a host name as sandbox host credentials name hosts.
var hostNameRE = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// maxCredentialFile bounds what readCredential reads: a token is a line.
const maxCredentialFile = 4096

// credentialFileRules are what a host's credential file must meet. It is
// only read, so a link (a Kubernetes secret volume's files are links) is
// followed and its target checked; root may own it (a mounted secret), and
// its group may read it (the group of a secret volume's fsGroup), but
// nobody else may, and only its owner may change it.
func credentialFileRules() ownfile.Rules {
	return ownfile.Rules{MaxBytes: maxCredentialFile, ForbiddenPerm: 0o027, FollowSymlinks: true, RootMayOwn: true}
}

// readCredential reads the host's token from path (credentialFileRules).
func readCredential(path string) (string, error) {
	b, err := ownfile.Read(path, credentialFileRules())
	var refused *ownfile.RefusedError
	switch {
	case errors.As(err, &refused) && refused.Why == ownfile.OpenMode:
		return "", fmt.Errorf("the credential file %s %v: refusing a token every user can see or someone else can change (chmod 600 %s, or 0440 with a group of its own; a Kubernetes secret volume: defaultMode 0440 or 0400)", path, refused, path)
	case errors.As(err, &refused):
		return "", fmt.Errorf("the credential file %s %v", path, refused)
	case err != nil:
		return "", fmt.Errorf("read the credential file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("the credential file %s is empty", path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("the credential file %s holds more than one line; it must hold the token alone", path)
	}
	return tok, nil
}

// loopback reports whether the URL's host is a loopback address or
// localhost.
func loopback(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// serveRemote is Serve over the WebSocket transport: configure the
// adapter, connect to the engine as worker cfg.Name, register
// <name>::<op> for every operation, serve until SIGINT or SIGTERM,
// reconnecting with backoff when the connection drops.
func serveRemote(cfg ServeConfig, o RemoteOptions, stderr io.Writer) int {
	log, levelErr := newRemoteLogger(cfg.Name, stderr, os.Getenv(EnvLogLevel))
	if levelErr != nil {
		log.Warn("ignoring "+EnvLogLevel, "error", levelErr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			log.Info(s.String() + " received; shutting down")
			cancel()
		case <-ctx.Done():
		}
	}()
	return runRemote(ctx, cancel, cfg, o, log)
}

func newRemoteLogger(name string, out io.Writer, level string) (hclog.Logger, error) {
	lvl := hclog.Info
	var err error
	if level != "" {
		if l := hclog.LevelFromString(level); l != hclog.NoLevel {
			lvl = l
		} else {
			err = fmt.Errorf("unknown log level %q (want trace, debug, info, warn or error)", level)
		}
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: lvl, Output: out}), err
}

// runRemote runs until ctx ends (cancel is what a rejected configuration
// calls) and returns the exit status.
func runRemote(ctx context.Context, cancel context.CancelFunc, cfg ServeConfig, o RemoteOptions, log hclog.Logger) int {
	token, err := readCredential(o.CredentialFile)
	if err != nil {
		log.Error(err.Error())
		return ExitFailed
	}
	if !loopback(o.EngineURL) && strings.HasPrefix(o.EngineURL, "ws://") {
		log.Warn("the engine address is not loopback and not wss://: the token and every call cross the network in clear text", "engine", o.EngineURL)
	}
	config := []byte("{}")
	if o.ConfigFile != "" {
		if config, err = os.ReadFile(o.ConfigFile); err != nil {
			log.Error("read the configuration file", "error", err)
			return ExitFailed
		}
	}

	st := newStopper(log, cancel)
	inner, ok := newAdapter(ctx, cfg, log)
	if !ok {
		return ExitFailed
	}
	served := newServedAdapter(inner, cfg, log, st)
	if o.HostName != "" {
		served.facts = map[string]any{HostNameFactKey: o.HostName}
	}
	defer func() {
		if err := shutdown(inner, timeoutOr(cfg.ShutdownTimeout, DefaultShutdownTimeout)); err != nil {
			log.Error("the adapter's shutdown failed", "error", err)
		}
		log.Info("adapter exiting")
	}()
	if err := served.Configure(ctx, config); err != nil {
		var rej *contract.ConfigRejectedError
		if errors.As(err, &rej) {
			return ExitConfigRejected
		}
		log.Error("configure the adapter", "error", err)
		return ExitFailed
	}

	ops := append(contract.Ops(), contract.OpAdapterInfo)
	if _, ok := inner.(contract.WorkerAdapter); ok {
		ops = append(ops, contract.WorkerOps()...)
	}
	if _, ok := inner.(contract.PauseAdapter); ok {
		ops = append(ops, contract.PauseOps()...)
	}
	r := &remote{cfg: cfg, o: o, token: token, log: log, served: served, ops: ops, table: adapterjson.Ops(), refused: make(chan error, 1)}
	code := r.loop(ctx)
	// Streams of fs::read still running end with the adapter's context.
	cancel()
	r.tasks.Close()
	wctx, wcancel := context.WithTimeout(context.Background(), timeoutOr(cfg.ShutdownTimeout, DefaultShutdownTimeout))
	_ = r.tasks.Wait(wctx)
	wcancel()
	return code
}

// remote is one adapter serving an engine over WebSocket.
type remote struct {
	cfg    ServeConfig
	o      RemoteOptions
	token  string
	log    hclog.Logger
	served *servedAdapter
	ops    []string
	table  map[string]adapterjson.OpFunc
	tasks  taskgroup.Group
	// refused carries the engine's refusal of a registration.
	refused chan error
}

// A remote adapter notices a dead link to the engine by itself (the engine
// also pings fleet hosts, engine/heartbeat.go): it pings every
// remotePingInterval and, when nothing at all came from the engine for
// remoteIdleTimeout, drops the connection and reconnects, so after a
// partition heals its sandboxes are reachable again within seconds.
const (
	remotePingInterval = time.Second
	remoteIdleTimeout  = 4 * time.Second
	remoteDialTimeout  = 5 * time.Second
	fleetReconnectMax  = 4 * time.Second
)

// loop connects, serves until the connection drops, and reconnects with
// backoff, until ctx ends. A refused credential ends it.
func (r *remote) loop(ctx context.Context) int {
	initial := timeoutOr(r.o.ReconnectInitial, 500*time.Millisecond)
	maxDelay := timeoutOr(r.o.ReconnectMax, 30*time.Second)
	if r.o.Fleet && r.o.ReconnectMax == 0 {
		// A fleet host that was cut off by a partition should be back
		// soon after the link heals, not half a minute later.
		maxDelay = fleetReconnectMax
	}
	delay := initial
	for {
		select { // a refusal of an earlier connection is stale
		case <-r.refused:
		default:
		}
		c, err := r.connect(ctx)
		if err == nil {
			r.log.Info("connected to the engine; serving", "engine", r.o.EngineURL, "namespace", r.o.Namespace,
				"worker_id", c.WorkerID(), "functions", len(r.ops), "host_name", r.o.HostName)
			select {
			case <-c.Done():
				delay = initial
				r.log.Warn("connection to the engine lost; reconnecting", "error", c.Err())
				r.close(c)
				continue
			case rerr := <-r.refused:
				// Serving some functions and not others would split the
				// adapter: drop the connection and try again later.
				r.log.Error("the engine refused one of the adapter's functions (another worker serves it?); reconnecting", "in", delay, "error", rerr)
				r.close(c)
			case <-ctx.Done():
				r.close(c)
				return ExitOK
			}
		} else if ctx.Err() != nil {
			return ExitOK
		}
		if client.CodeOf(err) == "AUTH_ERROR" {
			r.log.Error("the engine refused this adapter's credential (AUTH_ERROR); not retrying: put a token the engine accepts in the credential file and start the adapter again",
				"engine", r.o.EngineURL, "credential_file", r.o.CredentialFile, "error", err)
			return ExitAuthRejected
		}
		if err != nil {
			r.log.Warn("cannot connect to the engine; retrying", "engine", r.o.EngineURL, "in", delay, "error", err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ExitOK
		case <-t.C:
		}
		delay = min(2*delay, maxDelay)
	}
}

// close ends a connection, waiting a little for its calls in flight.
func (r *remote) close(c *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		r.log.Debug("close the connection", "error", err)
	}
}

// connect dials once and registers every function. The client's own
// reconnect is off: loop reconnects, so a refused credential is seen.
func (r *remote) connect(ctx context.Context) (*client.Client, error) {
	c, err := client.Dial(ctx, r.o.EngineURL, client.Options{
		Name:                r.workerName(),
		Namespace:           r.o.Namespace,
		Description:         "Sandbox adapter connected over WebSocket (sdk.Serve --engine).",
		Version:             versionOr(r.cfg.Version),
		IgnoreEnv:           true,
		Token:               r.token,
		Logger:              r.log.Named("client"),
		Reconnect:           client.ReconnectPolicy{Disable: true},
		PingInterval:        remotePingInterval,
		IdleTimeout:         remoteIdleTimeout,
		DialTimeout:         remoteDialTimeout,
		ConfirmRegistration: true,
		OnRegistrationError: func(err error) {
			select {
			case r.refused <- err:
			default:
			}
		},
	})
	if err != nil {
		return nil, err
	}
	t := &adapterjson.Target{
		Adapter:  r.served,
		Name:     r.cfg.Name,
		Channels: clientChannels{c: c},
		Log:      r.log,
		Life:     ctx,
		Go: func(f func()) error {
			if !r.tasks.Add() {
				return contract.NewError(contract.S301, "sandbox adapter %q is shutting down", r.cfg.Name)
			}
			go func() {
				defer r.tasks.Done()
				f()
			}()
			return nil
		},
	}
	for _, op := range r.ops {
		id := contract.AdapterFunctionID(r.cfg.Name, op)
		if r.o.Fleet {
			id = contract.HostFunctionID(r.cfg.Name, r.o.HostName, op)
		}
		def := client.FunctionDef{
			ID:             id,
			Description:    schema.Description(op),
			RequestSchema:  schema.Request(op),
			ResponseSchema: schema.Response(op),
		}
		if contract.IsWorkerOp(op) {
			// As the plugin host registers them: worker::* boots VMs from
			// host directories, so only the engine token's holder
			// (Compose) may call it.
			def.Metadata = privilegedMetadata
		}
		if _, err := c.RegisterFunction(def, r.handler(op, r.table[op], t)); err != nil {
			r.close(c)
			return nil, fmt.Errorf("register %s: %w", def.ID, err)
		}
	}
	return c, nil
}

// workerName is the worker the adapter connects as: its own name, or for a
// fleet host <adapter>-<host>, since the hosts of one fleet share a
// namespace and a worker name is unique in one.
func (r *remote) workerName() string {
	if r.o.Fleet {
		return r.cfg.Name + "-" + r.o.HostName
	}
	return r.cfg.Name
}

// privilegedMetadata marks a function privileged (the engine's
// MetadataPrivileged key): callers without the engine token get
// UNAUTHORIZED.
var privilegedMetadata = json.RawMessage(`{"privileged":true}`)

// handler serves op for the engine: the reply as iii's JSON, a sandbox
// error as its wire body.
func (r *remote) handler(op string, fn adapterjson.OpFunc, t *adapterjson.Target) client.Handler {
	return func(ctx context.Context, inv *client.Invocation) (any, error) {
		out, err := fn(ctx, t, inv.Data)
		return reply(ctx, op, out, err)
	}
}

// reply encodes an operation's outcome for the wire.
func reply(ctx context.Context, op string, out any, err error) (any, error) {
	if err == nil {
		b, err := contract.EncodeJSON(out)
		if err != nil {
			return nil, contract.NewError(contract.S300, "encode the adapter's %s reply: %v", op, err).ErrorBody()
		}
		return json.RawMessage(b), nil
	}
	var serr *contract.Error
	if errors.As(err, &serr) {
		return nil, serr.ErrorBody()
	}
	if ctx.Err() != nil {
		return nil, ctx.Err() // the caller went away; nobody reads this
	}
	code := contract.S300
	if contract.IsFsOp(op) {
		code = contract.S216
	}
	return nil, contract.AsError(err, code).ErrorBody()
}

// clientChannels gives the mapping the engine's channels through the Go
// client: each end is a WebSocket of its own.
type clientChannels struct{ c *client.Client }

var _ adapterjson.Channels = clientChannels{}

func (cc clientChannels) OpenReader(ctx context.Context, ref protocol.StreamChannelRef) (io.ReadCloser, error) {
	r, err := cc.c.OpenChannelReader(ctx, ref)
	if err != nil {
		return nil, err
	}
	// The client's reader is not bound to a call; the call's end closes it.
	stop := context.AfterFunc(ctx, func() { _ = r.Close() })
	return &boundReader{r: r, stop: stop}, nil
}

func (cc clientChannels) OpenWriter(ctx context.Context, ref protocol.StreamChannelRef) (adapterjson.ChannelWriter, error) {
	w, err := cc.c.OpenChannelWriter(ctx, ref)
	if err != nil {
		return nil, err
	}
	return clientWriter{w}, nil
}

func (cc clientChannels) Create(ctx context.Context) (writer, reader protocol.StreamChannelRef, err error) {
	return cc.c.CreateChannel(ctx, 0)
}

// Gone: the engine closed the writer's socket because the reader left.
func (clientChannels) Gone(err error) bool {
	return errors.Is(err, net.ErrClosed) || websocket.CloseStatus(err) != -1
}

type boundReader struct {
	r    *client.ChannelReader
	stop func() bool
}

func (b *boundReader) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *boundReader) Close() error {
	b.stop()
	return b.r.Close()
}

// clientWriter is the client's write end as the mapping's ChannelWriter.
// Abort can only close: the engine ends a channel the same way whatever
// status its writer's socket closes with, so a reader of a stream that
// broke off sees a short file (fs::read's reply carries the size to check
// it against).
type clientWriter struct{ w *client.ChannelWriter }

func (c clientWriter) WriteContext(ctx context.Context, p []byte) (int, error) {
	return c.w.WriteContext(ctx, p)
}

func (c clientWriter) WriteText(ctx context.Context, s string) error { return c.w.SendText(ctx, s) }

func (c clientWriter) Close() error { return c.w.Close() }

func (c clientWriter) Abort() { _ = c.w.Close() }
