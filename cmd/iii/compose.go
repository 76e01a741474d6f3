package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/daemon"
	"github.com/iii-sandbox/iii/compose/packages"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/protocol"
)

// composeFlags are the daemon options; --engine, -n and --up are
// persistent so `iii compose build` can refuse them and `iii compose logs`
// can use the first two.
type composeFlags struct {
	engine    string
	namespace string
	up        bool
	frozen    bool
	file      string
}

func newComposeCmd(e env) *cobra.Command {
	f := &composeFlags{}
	cmd := &cobra.Command{
		Use:   "compose",
		Short: "Run the Compose daemon: worker-compose.yaml projects on an engine",
		Long: `iii compose runs the Compose daemon, a worker named "compose" that serves compose::*
(up, down, restart, status, logs, ...) in its namespace. It never daemonizes: it runs until
SIGINT/SIGTERM or compose::stop, then stops every worker it started, and then the engine
if it started one.

--up also brings a project up. When its file has an engine: section (and no --engine is
given), Compose starts that engine itself and owns it: the engine stops with Compose, even
if Compose is killed.

The namespace is -n, else the namespace: of ./worker-compose.yaml (or of the --up file),
else "default". The engine is --engine, else $III_URL, else the file's engine.url, else
ws://127.0.0.1:49134.`,
		Example: `  iii compose --up
  iii compose --up -f ./deploy/worker-compose.yaml -n shop
  iii compose --engine ws://127.0.0.1:49134 -n dev
  iii call compose::up --namespace dev file=./worker-compose.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf(cmd, "unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("file") && !f.up {
				return composeUsage(cmd, compose.New(compose.CodeFileRequiresUp, fmt.Sprintf(
					"-f/--file is only valid with --up (it names the project to bring up); without --up the daemon reads ./%s for its defaults", composefile.FileName)))
			}
			if f.frozen && !f.up {
				return usageErrorf(cmd, "--frozen is only valid with --up")
			}
			return runCompose(cmd.Context(), e, f)
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.engine, "engine", "", "connect to the engine at this URL (overrides $III_URL and the file's engine.url)")
	pf.StringVarP(&f.namespace, "namespace", "n", "", `the daemon namespace, and every project's (default: the file's namespace:, else "default")`)
	pf.BoolVar(&f.up, "up", false, "bring the project up once the daemon serves")
	fl := cmd.Flags()
	fl.BoolVar(&f.frozen, "frozen", false, "with --up: never edit the compose file or the lock")
	fl.StringVarP(&f.file, "file", "f", "", "with --up: the compose file (default ./worker-compose.yaml)")
	cmd.AddCommand(newComposeLogsCmd(e, f), newComposeBuildCmd(e, f))
	return cmd
}

// composeUsage is a coded command-line error (exit 2).
func composeUsage(cmd *cobra.Command, err *compose.Error) error {
	return &usageError{err: err, hint: cmd.CommandPath()}
}

func composeLogger(e env) hclog.Logger {
	level := hclog.LevelFromString(strings.TrimSpace(e.getenv(envLogLevel)))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{Name: "compose", Output: e.stderr, Level: level})
}

// progressOn renders package downloads on w: a redrawn bar when w is a
// terminal, plain lines otherwise.
func progressOn(w io.Writer) packages.Progress {
	f, ok := w.(*os.File)
	return packages.Printer(w, ok && packages.IsTerminal(f))
}

func runCompose(ctx context.Context, e env, f *composeFlags) error {
	err := daemon.Run(ctx, daemon.Options{
		Namespace: f.namespace,
		EngineURL: f.engine,
		Up:        f.up,
		Frozen:    f.frozen,
		File:      f.file,
		LookupEnv: os.LookupEnv,
		Logger:    composeLogger(e),
		Out:       e.stdout,
		Packages:  daemon.PackageOptions{Progress: progressOn(e.stderr)},
	})
	if err != nil {
		return &exitError{code: exitFailure, msg: err.Error()}
	}
	return nil
}

// ---- iii compose logs ------------------------------------------------------

type composeLogsFlags struct {
	file   string
	tail   int
	follow bool
	stream string
}

// logsFollowWait is how long one follow call waits for new lines.
const logsFollowWait = 5000

func newComposeLogsCmd(e env, parent *composeFlags) *cobra.Command {
	lf := &composeLogsFlags{}
	cmd := &cobra.Command{
		Use:   "logs [WORKER]",
		Short: "Print workers' logs (compose::logs of the running daemon)",
		Long: `Print the logs Compose keeps for a project's workers: the newest --tail lines of each,
or of WORKER only. --follow keeps printing new lines until interrupted.

The daemon is found like iii compose finds its engine (--engine, $III_URL, the file's
engine.url, the default) in its namespace (-n, else the file's namespace:, else "default").`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageErrorf(cmd, "at most one WORKER, got %d", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if parent.up {
				return usageErrorf(cmd, "--up does not go with logs")
			}
			if lf.tail < 0 || lf.tail > 1000 {
				return usageErrorf(cmd, "--tail must be between 0 and 1000, not %d", lf.tail)
			}
			if lf.stream != "" && lf.stream != "stdout" && lf.stream != "stderr" {
				return usageErrorf(cmd, "--stream must be stdout or stderr, not %q", lf.stream)
			}
			worker := ""
			if len(args) == 1 {
				worker = args[0]
			}
			return runComposeLogs(cmd.Context(), e, parent, lf, worker)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&lf.file, "file", "f", "", "the compose file (default ./worker-compose.yaml)")
	fl.IntVar(&lf.tail, "tail", 100, "how many of the newest lines to print per worker (at most 1000)")
	fl.BoolVarP(&lf.follow, "follow", "F", false, "keep printing new lines")
	fl.StringVar(&lf.stream, "stream", "", "only stdout or stderr")
	return cmd
}

// logsTarget resolves the compose file, the daemon namespace and the
// engine of `iii compose logs`.
func logsTarget(e env, parent *composeFlags, lf *composeLogsFlags) (file, ns, url string, err error) {
	path := lf.file
	if path == "" {
		if _, serr := os.Stat(composefile.FileName); serr == nil {
			path = composefile.FileName
		}
	}
	var cf *composefile.File
	if path != "" {
		if path, err = filepath.Abs(path); err != nil {
			return "", "", "", err
		}
		if cf, err = composefile.Load(path, os.LookupEnv); err != nil {
			return "", "", "", err
		}
	}
	ns = "default"
	switch {
	case parent.namespace != "":
		if err := composefile.ValidNamespace(parent.namespace); err != nil {
			return "", "", "", err
		}
		ns = parent.namespace
	case cf != nil && cf.NamespaceSet:
		ns = cf.Namespace
	}
	switch {
	case parent.engine != "":
		url = parent.engine
	case e.getenv(daemon.EnvURL) != "":
		url = e.getenv(daemon.EnvURL)
	case cf != nil && cf.Engine != nil && cf.Engine.URL != "":
		url = cf.Engine.URL
	default:
		url = composefile.DefaultEngineURL
	}
	return path, ns, url, nil
}

type logsReply struct {
	Containers []struct {
		Container string       `json:"container"`
		Entries   []proc.Entry `json:"entries"`
		Cursor    proc.Cursor  `json:"cursor"`
		Truncated bool         `json:"truncated"`
	} `json:"containers"`
}

func runComposeLogs(ctx context.Context, e env, parent *composeFlags, lf *composeLogsFlags, worker string) error {
	file, ns, url, err := logsTarget(e, parent, lf)
	if err != nil {
		return &exitError{code: exitFailure, msg: err.Error()}
	}
	opts := client.Options{Name: "iii-cli:compose-logs", Description: "iii compose logs", IgnoreEnv: true,
		ConfirmRegistration: true, Reconnect: client.ReconnectPolicy{Disable: true}}
	tc := chooseToken(e, "", url, ns, func(msg string) { fmt.Fprintln(e.stderr, "warning:", msg) })
	c, _, err := dialWithToken(ctx, url, opts, tc)
	if client.CodeOf(err) == protocol.CodeWorkerNamespaceConflict {
		opts.Name = fmt.Sprintf("%s:%d", opts.Name, os.Getpid())
		c, _, err = dialWithToken(ctx, url, opts, tc)
	}
	if err != nil {
		return tokenConnectError(url, err, tc)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		defer cancel()
		_ = c.Close(cctx)
	}()
	req := map[string]any{"tail": lf.tail}
	if file != "" {
		req["file"] = file
	}
	if worker != "" {
		req["worker"] = worker
	}
	if lf.stream != "" {
		req["stream"] = lf.stream
	}
	width := 0
	for {
		raw, err := c.Call(ctx, "compose::logs", req, client.WithNamespace(ns), client.WithTimeout(30*time.Second))
		if err != nil {
			if errors.Is(err, context.Canceled) && lf.follow {
				return nil
			}
			return composeCallError(err, ns)
		}
		var rep logsReply
		if err := json.Unmarshal(raw, &rep); err != nil {
			return &exitError{code: exitFailure, msg: "compose::logs returned an unexpected reply: " + err.Error()}
		}
		cursors := map[string]proc.Cursor{}
		for _, ct := range rep.Containers {
			width = max(width, len(ct.Container))
		}
		for _, ct := range rep.Containers {
			cursors[ct.Container] = ct.Cursor
			for _, en := range ct.Entries {
				if worker != "" {
					fmt.Fprintln(e.stdout, en.Message)
				} else {
					fmt.Fprintf(e.stdout, "%-*s | %s\n", width, ct.Container, en.Message)
				}
			}
		}
		if !lf.follow {
			return nil
		}
		req["cursors"] = cursors
		req["wait_ms"] = logsFollowWait
	}
}

// composeCallError words a failed compose::* call: "CODE: message".
func composeCallError(err error, ns string) error {
	var eb *protocol.ErrorBody
	switch {
	case errors.As(err, &eb) && eb.Code == protocol.CodeFunctionNotFound:
		return &exitError{code: exitFailure, msg: fmt.Sprintf("no Compose daemon serves namespace %q on this engine (start one with `iii compose -n %s`): %s", ns, ns, eb.Message)}
	case errors.As(err, &eb):
		return &exitError{code: exitFailure, msg: eb.Code + ": " + eb.Message}
	case errors.Is(err, context.Canceled):
		return &exitError{code: exitInterrupted, msg: "interrupted"}
	default:
		return &exitError{code: exitFailure, msg: err.Error()}
	}
}

// ---- iii compose build -----------------------------------------------------

func newComposeBuildCmd(e env, parent *composeFlags) *cobra.Command {
	var file string
	var frozen bool
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Validate the compose file, prepare worker-compose.lock and download every package:// worker",
		Long: `iii compose build reads and validates the compose file, prepares worker-compose.lock beside
it (resolving what the lock does not cover yet), and downloads every package:// worker into the
shared package cache, verifying each artefact's SHA-256. It connects to no engine, starts no
worker and runs no hook; iii compose --up then starts from the cache.

--frozen never resolves and never writes: the lock must match the compose file
(COMPOSE_LOCK_REQUIRED, COMPOSE_LOCK_OUT_OF_DATE), and missing packages are downloaded only from
the locked URLs and checked against the locked digests.`,
		Example: `  iii compose build
  iii compose build -f ./deploy/worker-compose.yaml --frozen`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var bad []string
			for _, name := range []string{"engine", "namespace", "up"} {
				if cmd.Flags().Changed(name) {
					bad = append(bad, "--"+name)
				}
			}
			if len(bad) > 0 {
				return composeUsage(cmd, compose.New(compose.CodeBuildConflictsWithServeOptions, fmt.Sprintf(
					"iii compose build prepares packages offline and serves nothing, so %s do not go with it; run `iii compose build` alone, then `iii compose --up`",
					strings.Join(bad, " and "))))
			}
			return runComposeBuild(cmd.Context(), e, file, cmd.Flags().Changed("file"), frozen)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", composefile.FileName, "the compose file")
	cmd.Flags().BoolVar(&frozen, "frozen", false, "check the lock instead of writing it; never edit the compose file")
	return cmd
}

// runComposeBuild prepares the lock and the package cache and says, per
// container, what it did.
func runComposeBuild(ctx context.Context, e env, file string, fileGiven, frozen bool) error {
	if !fileGiven {
		file = ""
	}
	res, err := daemon.Build(ctx, daemon.BuildOptions{
		File: file, Frozen: frozen, LookupEnv: os.LookupEnv, Out: e.stdout,
		Packages: daemon.PackageOptions{Progress: progressOn(e.stderr)},
	})
	if err != nil {
		return &exitError{code: exitFailure, msg: err.Error()}
	}
	if res.AdapterAdded != "" {
		fmt.Fprintf(e.stdout, "%s: added to %s (the project needs the sandbox adapter)\n", res.AdapterAdded, res.File)
	}
	for _, c := range res.Containers {
		switch {
		case c.Package == "":
			fmt.Fprintf(e.stdout, "%s: path:// worker, nothing to build\n", c.Container)
		case c.Reused:
			fmt.Fprintf(e.stdout, "%s: %s (%s), in the package cache: %s\n", c.Container, c.Package, c.Type, c.Dir)
		default:
			fmt.Fprintf(e.stdout, "%s: %s (%s), downloaded and verified: %s\n", c.Container, c.Package, c.Type, c.Dir)
		}
	}
	switch {
	case res.Lock == "":
	case frozen:
		fmt.Fprintf(e.stdout, "lock %s matches (frozen)\n", res.Lock)
	case res.LockWritten:
		fmt.Fprintf(e.stdout, "lock %s written\n", res.Lock)
	default:
		fmt.Fprintf(e.stdout, "lock %s is up to date\n", res.Lock)
	}
	return nil
}

// ---- hidden helpers --------------------------------------------------------

// newReaperCmd is `iii __compose-reaper`, the process Compose starts next to
// its workers (compose/proc.ReaperMain).
func newReaperCmd(e env) *cobra.Command {
	return &cobra.Command{
		Use:                proc.ReaperCommand,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			if code := proc.ReaperMain(e.stdin, e.stdout, e.stderr, args); code != 0 {
				return &exitError{code: code, msg: "reaper: bad arguments"}
			}
			return nil
		},
	}
}
