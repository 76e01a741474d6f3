package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/cmd/iii/internal/jsonpretty"
	"github.com/iii-sandbox/iii/cmd/iii/internal/payload"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

// cliWorkerName is the worker name `iii call` registers under. A second
// concurrent call finds it taken and falls back to a per-process name.
const cliWorkerName = "iii-cli:call"

// closeGrace bounds the goodbye to the engine after the result is in.
const closeGrace = 2 * time.Second

type callFlags struct {
	json      string
	address   string
	port      int
	timeoutMS int64
	namespace string
	// noProgress skips the progress channel of functions that offer one.
	noProgress bool
	// token is --token: the engine token (or a credential) to present.
	token string
	// output is --output: "text" prints a sandbox error (an S-code) as
	// readable lines, "json" prints every error body as the raw object.
	output string
}

// Values of --output.
const (
	outputText = "text"
	outputJSON = "json"
)

func newCallCmd(e env, defaultHelp func(*cobra.Command, []string)) *cobra.Command {
	f := &callFlags{}
	cmd := &cobra.Command{
		Use:     "call FUNCTION [KEY=VALUE]...",
		Aliases: []string{"trigger", "t"},
		Short:   "Call a function on the running engine",
		Long: `Call FUNCTION on the engine and print its result as JSON.

The payload is {} by default. KEY=VALUE pairs build an object: each value is
decoded as JSON when it is JSON (n=10, ok=true, tags='["a"]'), else it is a
string (name=alice). --json gives the whole payload; with KEY=VALUE pairs it
must be an object and the pairs override its keys. A repeated key: the last
one wins.

Without -n the function resolves in the "default" namespace.

A function whose request schema marks a field as a progress channel
(sandbox::create and sandbox::run: "progress") gets a channel there, unless
the payload sets that field itself, and its progress is drawn on stderr: a
redrawn bar on a terminal, plain lines otherwise. --no-progress leaves the
field out. The result on stdout is the same either way.

A sandbox error (code S001...S999, its message the error object of the
sandbox contract) is printed as lines: the code and its meaning, the
message, the fix, whether a retry can help and the docs link. --output json
prints the error body as the engine sent it instead, the S-code object
whole in its message (--json is the payload, not the output format).
"iii call -h FUNCTION" also shows the function's description and request
schema, as the running engine knows them.`,
		Example: `  iii call engine::workers::list
  iii call compose::up --namespace dev file=./worker-compose.yaml
  iii call sandbox::run --json '{"image":"python","code":"print(2+2)"}'
  iii call math::add a=2 b=3 --timeout-ms 5000`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf(cmd, "missing FUNCTION to call")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(cmd); err != nil {
				return err
			}
			data, err := payload.Parse(args[1:], f.json, cmd.Flags().Changed("json"))
			if err != nil {
				return &usageError{err: err, hint: cmd.CommandPath()}
			}
			var ns *string
			if cmd.Flags().Changed("namespace") {
				ns = &f.namespace
			}
			return runCall(cmd.Context(), e, f, args[0], data, ns)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.json, "json", "", "the payload as JSON (an object when KEY=VALUE pairs are given too)")
	fl.StringVar(&f.address, "address", "localhost", "engine host")
	fl.IntVar(&f.port, "port", 49134, "engine WebSocket port")
	fl.Int64Var(&f.timeoutMS, "timeout-ms", 30000, "how long to wait for the result, in milliseconds")
	fl.StringVarP(&f.namespace, "namespace", "n", "", `namespace FUNCTION resolves in (default "default")`)
	fl.BoolVar(&f.noProgress, "no-progress", false, "do not ask for progress, and draw none (functions with a progress channel)")
	fl.StringVarP(&f.output, "output", "o", outputText, `how errors are printed: "text" (a sandbox error as readable lines) or "json" (every error body as the raw object)`)
	fl.StringVar(&f.token, "token", "", "the engine token to present (default: $III_ENGINE_TOKEN, else the one in ~/.iii/engine-token or the project's)")

	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		defaultHelp(c, args)
		if c != cmd {
			return
		}
		if fn := c.Flags().Args(); len(fn) > 0 {
			functionHelp(c, e, f, fn[0])
		}
	})
	return cmd
}

func (f *callFlags) validate(cmd *cobra.Command) error {
	switch {
	case strings.TrimSpace(f.address) == "":
		return usageErrorf(cmd, "--address must not be empty")
	case f.port < 1 || f.port > 65535:
		return usageErrorf(cmd, "--port must be between 1 and 65535, not %d", f.port)
	case f.timeoutMS <= 0:
		return usageErrorf(cmd, "--timeout-ms must be positive, not %d", f.timeoutMS)
	case f.output != outputText && f.output != outputJSON:
		return usageErrorf(cmd, "--output must be %q or %q, not %q", outputText, outputJSON, f.output)
	case cmd.Flags().Changed("namespace") && !client.ValidNamespace(f.namespace):
		return usageErrorf(cmd, "invalid namespace %q: use only lowercase letters, digits, '-' and '_'", f.namespace)
	}
	return nil
}

func (f *callFlags) url() string {
	return "ws://" + net.JoinHostPort(f.address, strconv.Itoa(f.port))
}

func (f *callFlags) timeout() time.Duration { return time.Duration(f.timeoutMS) * time.Millisecond }

// dial connects as the CLI worker, presenting the engine token it finds
// (--token, $III_ENGINE_TOKEN, ~/.iii/engine-token, the project's; see
// chooseToken). The worker name is confirmed before any call goes out, so
// a name clash with another running `iii call` is caught while nothing has
// been invoked yet, and retried under a unique name. withToken reports
// whether the connection presents a token.
func dial(ctx context.Context, e env, f *callFlags) (c *client.Client, withToken bool, err error) {
	opts := client.Options{
		Name:                cliWorkerName,
		Description:         "iii call",
		IgnoreEnv:           true,
		ConfirmRegistration: true,
		Reconnect:           client.ReconnectPolicy{Disable: true},
		DialTimeout:         min(client.DefaultDialTimeout, f.timeout()),
	}
	tc := chooseToken(e, f.token, f.url(), f.namespace, func(msg string) { fmt.Fprintln(e.stderr, "warning:", msg) })
	c, withToken, err = dialWithToken(ctx, f.url(), opts, tc)
	if client.CodeOf(err) == protocol.CodeWorkerNamespaceConflict {
		opts.Name = fmt.Sprintf("%s:%d", cliWorkerName, os.Getpid())
		c, withToken, err = dialWithToken(ctx, f.url(), opts, tc)
	}
	if err != nil {
		return nil, false, tokenConnectError(f.url(), err, tc)
	}
	return c, withToken, nil
}

// connectError words a failed connection for the terminal.
func connectError(u string, err error) error {
	var eb *protocol.ErrorBody
	switch {
	case errors.Is(err, context.Canceled):
		return &exitError{code: exitInterrupted, msg: "interrupted"}
	case errors.As(err, &eb):
		return &exitError{code: exitFailure, msg: fmt.Sprintf("the engine at %s refused the connection: %s", u, eb.Error())}
	case client.CodeOf(err) == client.CodeEngineUnreachable:
		return &exitError{code: exitFailure, msg: err.Error()}
	default:
		return &exitError{code: exitFailure, msg: fmt.Sprintf("cannot connect to the engine at %s: %v", u, err)}
	}
}

func runCall(ctx context.Context, e env, f *callFlags, fn string, data json.RawMessage, ns *string) error {
	c, withToken, err := dial(ctx, e, f)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		defer cancel()
		_ = c.Close(cctx)
	}()

	opts := []client.CallOption{client.WithTimeout(f.timeout())}
	if ns != nil {
		opts = append(opts, client.WithNamespace(*ns))
	}
	var watch *progressWatch
	if !f.noProgress {
		data, watch = watchProgress(ctx, c, f, fn, ns, data, e.stderr, isTerminal(e.stderr))
	}
	res, err := c.Call(ctx, fn, data, opts...)
	// The progress lines are complete before the result or the error is
	// printed.
	watch.stop()
	if err != nil {
		xe := callError(err, f.output == outputJSON)
		if hint := unauthorizedHint(err, withToken); hint != "" {
			var ex *exitError
			if errors.As(xe, &ex) {
				ex.msg += "\nhint: " + hint
			}
		}
		return xe
	}
	if len(res) == 0 {
		return nil
	}
	out, err := prettyJSON(res)
	if err != nil {
		return &exitError{code: exitFailure, msg: fmt.Sprintf("%s returned a result that is not JSON: %v", fn, err)}
	}
	_, err = fmt.Fprintln(e.stdout, out)
	return err
}

// callError shapes a failed call: a sandbox error as readable lines
// (unless raw), any other remote error as the pretty JSON of its body, the
// client's own failures (timeout, lost connection) as their message.
func callError(err error, raw bool) error {
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		if se, ok := contract.FromErrorBody(eb); ok && !raw {
			return &exitError{code: exitFailure, msg: readableSandboxError(se)}
		}
		body, jerr := prettyJSON(mustJSON(eb))
		if jerr != nil {
			return &exitError{code: exitFailure, msg: eb.Error()}
		}
		return &exitError{code: exitFailure, msg: body}
	}
	if errors.Is(err, context.Canceled) {
		return &exitError{code: exitInterrupted, msg: "interrupted"}
	}
	return &exitError{code: exitFailure, msg: err.Error()}
}

// readableSandboxError prints a sandbox error one field a line: the code
// and its meaning, the message, the fix (a patch to merge into the request
// and its note, or the note alone), whether a retry can help, the docs.
func readableSandboxError(se *contract.Error) string {
	var b strings.Builder
	b.WriteString(string(se.Code))
	if info, ok := contract.LookupCode(se.Code); ok {
		b.WriteString(" " + info.Title)
	}
	if se.Type != "" {
		b.WriteString(" (" + se.Type + ")")
	}
	b.WriteString("\nmessage: " + se.Message)
	switch {
	case se.Fix != nil && se.FixNote != "":
		b.WriteString("\nfix: " + strings.TrimSpace(string(mustJSON(se.Fix))) + ": " + se.FixNote)
	case se.Fix != nil:
		b.WriteString("\nfix: " + strings.TrimSpace(string(mustJSON(se.Fix))))
	case se.FixNote != "":
		b.WriteString("\nfix: " + se.FixNote)
	}
	if se.Retryable {
		b.WriteString("\nretryable: yes")
	} else {
		b.WriteString("\nretryable: no")
	}
	if se.DocsURL != "" {
		b.WriteString("\ndocs: " + se.DocsURL)
	}
	return b.String()
}

func mustJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return []byte(`null`)
	}
	return b.Bytes()
}

// prettyJSON is how results and error bodies are printed.
func prettyJSON(raw []byte) (string, error) { return jsonpretty.Indent(raw) }
