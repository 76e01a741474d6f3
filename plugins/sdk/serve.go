package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterrpc"
)

// Environment variables an adapter process reads.
const (
	// EnvLifelineFD names an inherited file descriptor (the read end of a
	// pipe whose write end only the engine holds). When it reads EOF the
	// engine is gone, however it died, and the adapter shuts down and
	// exits, so an adapter never outlives a SIGKILLed engine.
	EnvLifelineFD = "III_ADAPTER_LIFELINE_FD"
	// EnvLogLevel sets the adapter's log level: trace, debug, info (the
	// default), warn or error.
	EnvLogLevel = "III_ADAPTER_LOG_LEVEL"
)

// Exit statuses of an adapter process.
const (
	// ExitOK: stopped by the host (go-plugin's controller), SIGTERM, or
	// the lifeline.
	ExitOK = 0
	// ExitFailed: could not start (run by hand, bad environment, the
	// adapter's constructor failed, go-plugin could not serve).
	ExitFailed = 1
	// ExitConfigRejected: the adapter refused its configuration; the
	// reason is in the log and in the Configure reply. 78 is EX_CONFIG
	// from sysexits.h.
	ExitConfigRejected = 78
)

// DefaultShutdownTimeout bounds an adapter's Shutdown when ServeConfig
// leaves it zero. go-plugin's Client.Kill waits two seconds for a plugin to
// exit after asking it to, so Shutdown should be quick: stop what must not
// be left behind, not drain work.
const DefaultShutdownTimeout = 5 * time.Second

// ServeConfig describes an adapter binary.
type ServeConfig struct {
	// Name is the adapter's name, e.g. "sandbox-hostdir": the worker name
	// the engine publishes it under, and the name in its logs.
	Name string
	// Version is the adapter's own version (adapter::info's
	// adapter_version).
	Version string
	// New builds the adapter. It runs after stdout is guarded and the
	// logger is ready, so anything it prints cannot break the handshake;
	// do the adapter's setup here, not in main before Serve. ctx ends
	// when the adapter starts shutting down. log writes hclog JSON to
	// stderr, which the engine reads into its own log.
	New func(ctx context.Context, log hclog.Logger) (contract.Adapter, error)
	// ShutdownTimeout bounds the adapter's Shutdown; zero means
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Images, when set, names the images the adapter's catalog offers
	// without configuration (its presets, e.g. python and node): the
	// image_allowlist examples of --help use them. Nil: the examples name
	// a placeholder image, never one the adapter may not have.
	Images func() []string
}

// Shutdowner is implemented by adapters that hold something that must not
// outlive the process (sandboxes, VMs, temporary directories). Serve calls
// Shutdown once, with a deadline, when the adapter is stopped: by the host,
// by SIGTERM, or because the engine died (the lifeline).
type Shutdowner interface {
	Shutdown(ctx context.Context) error
}

// Serve runs an adapter plugin and never returns: it exits the process
// when the adapter stops. Call it first thing in main:
//
//	func main() {
//		sdk.Serve(sdk.ServeConfig{Name: "sandbox-mine", Version: "0.1.0", New: newAdapter})
//	}
//
// Serve speaks go-plugin over gRPC with the contract's handshake and
// versioned plugin set, keeps stdout for the handshake line alone, logs
// hclog JSON on stderr, watches the lifeline, and shuts the adapter down
// on the host's request or SIGTERM. An adapter that rejects its
// configuration exits with ExitConfigRejected right after its reply.
func Serve(cfg ServeConfig) {
	os.Exit(serve(cfg))
}

// serve is Serve without the exit, returning the exit status.
func serve(cfg ServeConfig) int {
	if cfg.Name == "" || cfg.New == nil {
		fmt.Fprintln(os.Stderr, "sdk.Serve: ServeConfig needs a Name and a New function; this is a bug in the adapter, please report it to its author")
		return ExitFailed
	}
	if os.Getenv(contract.HandshakeMagicCookieKey) != contract.HandshakeMagicCookieValue {
		ro, remote, err := remoteArgs(os.Args[1:], os.Getenv)
		switch {
		case errors.Is(err, flag.ErrHelp):
			fmt.Fprint(os.Stdout, serveHelp(cfg))
			return ExitOK
		case err != nil:
			fmt.Fprintf(os.Stderr, "%s serve: %v\n%s(%s serve --help describes every flag)\n", cfg.Name, err, remoteUsage(cfg.Name), cfg.Name)
			return ExitFailed
		case remote:
			return serveRemote(cfg, ro, os.Stderr)
		}
		return byHand(cfg, os.Args[1:], os.Stdout, os.Stderr)
	}

	// The lifeline is taken over before this process opens descriptors of
	// its own, so a wrong number cannot name one of them.
	var lifeline *os.File
	var lifelineErr error
	if v, ok := os.LookupEnv(EnvLifelineFD); ok {
		lifeline, lifelineErr = openLifeline(v)
		if lifelineErr != nil {
			lifelineErr = fmt.Errorf("bad %s=%q from the engine; refusing to run without a lifeline: %w", EnvLifelineFD, v, lifelineErr)
		}
		// Children of the adapter must not mistake the engine's
		// lifeline for one of their own.
		_ = os.Unsetenv(EnvLifelineFD)
	}

	real, err := protectStdout()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: cannot guard stdout for the plugin handshake: %v\n", cfg.Name, err)
		return ExitFailed
	}
	// The logger keeps the real stderr: go-plugin later points the
	// os.Stderr variable at a pipe of its own.
	log, levelErr := newLogger(cfg.Name, os.Stderr, os.Getenv(EnvLogLevel))
	if levelErr != nil {
		log.Warn("ignoring "+EnvLogLevel, "error", levelErr)
	}
	if lifelineErr != nil {
		log.Error(lifelineErr.Error())
		return ExitFailed
	}
	guard, err := interceptStdout(log, real)
	if err != nil {
		log.Error("cannot intercept stdout", "error", err)
		return ExitFailed
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := newStopper(log, cancel)

	if lifeline != nil {
		go watchLifeline(lifeline, func(err error) {
			log.Info("the engine's lifeline closed; shutting down", "cause", err)
			st.stop(stopLifeline, ExitOK)
		})
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
			log.Info("SIGTERM received; shutting down")
			st.stop(stopSignal, ExitOK)
		case <-ctx.Done():
		}
	}()

	adapter, ok := newAdapter(ctx, cfg, log)
	if !ok {
		return ExitFailed
	}
	served := newServedAdapter(adapter, cfg, log, st)

	if !st.requested() {
		p := &adapterrpc.Plugin{Impl: served, Name: cfg.Name, Log: log}
		plugin.Serve(&plugin.ServeConfig{
			HandshakeConfig:  contract.Handshake(),
			VersionedPlugins: adapterrpc.VersionedPlugins(p),
			GRPCServer:       st.newServer,
			Logger:           log.Named("plugin"),
		})
		p.Close()
	}
	cancel()

	code, why := st.outcome()
	switch {
	case why != stopNone:
		log.Debug("stopping", "reason", string(why))
	case !guard.handshakeSent():
		log.Error("go-plugin could not serve the adapter (see the errors above)")
		code = ExitFailed
	default:
		log.Debug("stopping: the host shut the plugin down")
	}
	if err := shutdown(adapter, timeoutOr(cfg.ShutdownTimeout, DefaultShutdownTimeout)); err != nil {
		log.Error("the adapter's shutdown failed", "error", err)
	}
	log.Info("adapter exiting", "status", code)
	return code
}

func timeoutOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// shutdown calls the adapter's Shutdown, if it has one, with a deadline.
func shutdown(adapter contract.Adapter, timeout time.Duration) error {
	s, ok := adapter.(Shutdowner)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.Shutdown(ctx)
}

// newLogger is the adapter's hclog JSON logger on stderr. go-plugin's host
// parses these lines and re-emits them with their levels and fields.
func newLogger(name string, out io.Writer, level string) (hclog.Logger, error) {
	lvl := hclog.Info
	var err error
	if level != "" {
		if l := hclog.LevelFromString(level); l != hclog.NoLevel {
			lvl = l
		} else {
			err = fmt.Errorf("unknown log level %q (want trace, debug, info, warn or error)", level)
		}
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      lvl,
		Output:     out,
		JSONFormat: true,
	}), err
}

// byHand explains what the binary is to someone who ran it from a shell:
// go-plugin's own message talks about "plugins" in general, this one
// names the engine and how to use the adapter. --version is answered so
// packagers and users can check a binary without starting an engine.
// Asked for help (--help, -h, help), it prints the same to stdout and
// exits 0.
func byHand(cfg ServeConfig, args []string, stdout, stderr io.Writer) int {
	out, code := stderr, ExitFailed
	if len(args) == 1 {
		switch args[0] {
		case "--version", "-version", "version":
			fmt.Fprintf(stdout, "%s %s (iii sandbox adapter, sandbox contract %d.%d)\n",
				cfg.Name, versionOr(cfg.Version), contract.Major, contract.Minor)
			return ExitOK
		case "--help", "-help", "-h", "help":
			out, code = stdout, ExitOK
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s is an iii sandbox adapter plugin (sandbox contract %d.%d).\n",
		cfg.Name, versionOr(cfg.Version), contract.Major, contract.Minor)
	b.WriteString("It is started by the iii engine, not by hand. To use it, install the binary where the engine\n")
	b.WriteString("looks for adapters (~/.iii/plugins, a directory on $III_PLUGIN_PATH, or beside iii) and bind it\n")
	b.WriteString("in config.yaml with its configuration (without one it admits no image):\n\n")
	fmt.Fprintf(&b, "    sandbox:\n      adapter: %s\n      namespace: default\n      config:\n        image_allowlist: [%s]\n\n", cfg.Name, strings.Join(exampleImages(cfg), ", "))
	b.WriteString("then start the engine with `iii` (it starts the adapter itself, and again when that section\n")
	b.WriteString("changes) and call sandbox::* functions, e.g. `iii call sandbox::catalog::list`.\n")
	b.WriteString("To start it in an engine that already runs:\n\n")
	fmt.Fprintf(&b, "    iii call engine::adapters::start --json '{\"adapter\":\"%s\",\"namespace\":\"default\",\"config\":%s}'\n\n", cfg.Name, exampleConfigJSON(cfg))
	b.WriteString("To run it on another machine, connected to the engine over WebSocket (docs/remote-adapters.md):\n\n")
	b.WriteString(remoteUsage(cfg.Name))
	fmt.Fprintf(&b, "\nAs one host of a fleet (docs/scale-out.md), add --fleet and --host-name; `%s serve --help` describes every flag.\n", cfg.Name)
	if exampleImages(cfg)[0] == placeholderImage {
		fmt.Fprintf(&b, "%s is a placeholder: use an image of the adapter's catalog (its documentation names them).\n", placeholderImage)
	}
	b.WriteString("Run it with --version to print its version.\n")
	fmt.Fprint(out, b.String())
	return code
}

// placeholderImage stands in the examples for an adapter that does not
// name its images (ServeConfig.Images).
const placeholderImage = "IMAGE"

// exampleImages are the images the help's image_allowlist examples name:
// the adapter's own (at most two), else the placeholder.
func exampleImages(cfg ServeConfig) []string {
	var names []string
	if cfg.Images != nil {
		for _, n := range cfg.Images() {
			if n != "" {
				names = append(names, n)
			}
		}
	}
	if len(names) == 0 {
		return []string{placeholderImage}
	}
	return names[:min(len(names), 2)]
}

// exampleConfigJSON is an adapter configuration admitting exampleImages.
func exampleConfigJSON(cfg ServeConfig) string {
	b, err := json.Marshal(map[string][]string{"image_allowlist": exampleImages(cfg)})
	if err != nil {
		return `{"image_allowlist":["` + placeholderImage + `"]}`
	}
	return string(b)
}

func versionOr(v string) string {
	if v == "" {
		return "(unversioned)"
	}
	return v
}

// openLifeline parses EnvLifelineFD's value and takes the descriptor over.
func openLifeline(v string) (*os.File, error) {
	fd, err := parseFD(v)
	if err != nil {
		return nil, err
	}
	return inheritFD(fd, "engine-lifeline")
}

// parseFD reads a file descriptor number: decimal digits only, no sign,
// no spaces, at most 2^31-1.
func parseFD(v string) (int, error) {
	if v == "" || len(v) > 10 || strings.TrimLeft(v, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a file descriptor number", v)
	}
	fd, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not a file descriptor number", v)
	}
	return int(fd), nil
}

// watchLifeline blocks until the lifeline reads EOF or fails, then calls
// gone. Nothing is ever written to it: any byte is ignored, only the end
// of the pipe matters.
func watchLifeline(f *os.File, gone func(error)) {
	defer f.Close()
	buf := make([]byte, 64)
	for {
		_, err := f.Read(buf)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("EOF: the engine closed its end or died")
			}
			gone(err)
			return
		}
	}
}

// remoteUsage is the WebSocket transport's synopsis.
func remoteUsage(name string) string {
	return fmt.Sprintf("    %s serve --engine wss://ENGINE:49134 --credential-file FILE [--namespace NS] [--host-name NAME [--fleet]] [--config-file CONFIG.json]\n", name) +
		fmt.Sprintf("    (or %s, %s, %s, %s, %s, %s=1)\n", EnvEngineURL, EnvCredentialFile, EnvNamespace, EnvHostName, EnvConfigFile, EnvFleet)
}

// newAdapter calls cfg.New and logs why it gave no adapter; both
// transports start with it.
func newAdapter(ctx context.Context, cfg ServeConfig, log hclog.Logger) (contract.Adapter, bool) {
	adapter, err := cfg.New(ctx, log.Named("adapter"))
	if err != nil {
		log.Error("the adapter could not be created", "error", err)
		return nil, false
	}
	if adapter == nil {
		log.Error("the adapter's New returned no adapter and no error; this is a bug in the adapter")
		return nil, false
	}
	return adapter, true
}
