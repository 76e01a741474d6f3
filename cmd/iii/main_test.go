package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/version"
	"github.com/iii-sandbox/iii/protocol"
)

// TestMain lets the test binary act as the `iii` command inside scripts,
// and checks that the tests themselves leave no goroutine behind.
func TestMain(m *testing.M) {
	testscript.Main(leakCheck{m}, map[string]func(){
		"iii": func() {
			os.Exit(run(os.Args[1:], env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
		},
	})
}

type leakCheck struct{ m *testing.M }

func (l leakCheck) Run() int {
	code := l.m.Run()
	removeAdapterDir()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// setupWait bounds the set-up of a script's engine; a safety net only.
const setupWait = 10 * time.Second

// TestScripts runs testdata/script/*.txtar. Each script gets its own real
// engine (engine.New over a loopback listener) with test workers attached
// through the client package, and these variables:
//
//	ENGINE_PORT  the engine's port on 127.0.0.1
//	DEAD_PORT    a loopback port nobody listens on
//	FREE_PORT    a loopback port free for an engine the script starts
//	VERSION      the version `iii --version` must print
func TestScripts(t *testing.T) {
	t.Parallel()
	testscript.Run(t, testscript.Params{
		Dir:   "testdata/script",
		Setup: setupScript,
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"exitcode": cmdExitCode,
			"cmpfrom":  cmdCmpFrom,
			"waitport": cmdWaitPort,
			"waitfile": cmdWaitFile,
			"perm":     cmdPerm,
		},
	})
}

func setupScript(e *testscript.Env) error {
	eng := engine.New(engine.Options{Version: version.Version})
	srv := httptest.NewServer(eng.Handler())
	e.Defer(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupWait)
		defer cancel()
		_ = eng.Close(ctx)
		srv.Close()
	})
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		return err
	}
	u := "ws://" + srv.Listener.Addr().String()
	if err := attachTestWorkers(e, u); err != nil {
		return err
	}
	dead, err := freePort()
	if err != nil {
		return err
	}
	free, err := freePort()
	if err != nil {
		return err
	}
	e.Setenv("ENGINE_PORT", port)
	e.Setenv("DEAD_PORT", dead)
	e.Setenv("FREE_PORT", free)
	e.Setenv("VERSION", version.Version)
	// The engines a script starts keep their token in ~/.iii/engine-token:
	// a home of the script's own, not testscript's /no-home.
	e.Setenv("HOME", filepath.Join(e.WorkDir, "home"))
	return nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (string, error) {
	p, err := loopback.FreePort()
	return strconv.Itoa(p), err
}

// docRequestSchema is what `iii call -h test::doc` renders.
const docRequestSchema = `{"type":"object","required":["a","b"],"properties":{
  "a":{"type":"integer","description":"First addend."},
  "b":{"type":"integer","description":"Second addend."},
  "round":{"type":"string","enum":["up","down"],"default":"up","description":"Rounding."},
  "opts":{"type":"object","properties":{"trace":{"type":"boolean","default":false}}}}}`

// attachTestWorkers connects the functions the scripts call, as ordinary
// socket workers, and waits until the engine routes them.
func attachTestWorkers(e *testscript.Env, u string) error {
	ctx, cancel := context.WithTimeout(context.Background(), setupWait)
	defer cancel()
	dial := func(name, ns string) (*client.Client, error) {
		c, err := client.Dial(ctx, u, client.Options{Name: name, Namespace: ns, IgnoreEnv: true, ConfirmRegistration: true,
			Reconnect: client.ReconnectPolicy{Disable: true}})
		if err != nil {
			return nil, err
		}
		e.Defer(func() {
			cctx, cancel := context.WithTimeout(context.Background(), setupWait)
			defer cancel()
			_ = c.Close(cctx)
		})
		return c, nil
	}
	w, err := dial("iii-test", "")
	if err != nil {
		return err
	}
	dev, err := dial("iii-test-dev", "dev")
	if err != nil {
		return err
	}
	type fn struct {
		c   *client.Client
		def client.FunctionDef
		h   client.Handler
	}
	fns := []fn{
		{w, client.FunctionDef{ID: "test::echo", Description: "Returns its payload."}, echo},
		{w, client.FunctionDef{ID: "test::scalar"}, func(context.Context, *client.Invocation) (any, error) { return 42, nil }},
		{w, client.FunctionDef{ID: "test::null"}, func(context.Context, *client.Invocation) (any, error) { return nil, nil }},
		{w, client.FunctionDef{ID: "test::html"}, func(context.Context, *client.Invocation) (any, error) {
			return map[string]string{"tag": "<b>&</b>"}, nil
		}},
		{w, client.FunctionDef{ID: "test::fail"}, func(context.Context, *client.Invocation) (any, error) {
			return nil, &protocol.ErrorBody{Code: "E_TEST", Message: "it <broke> & failed", Stacktrace: "at test::fail"}
		}},
		{w, client.FunctionDef{ID: "test::sandboxfail"}, func(_ context.Context, inv *client.Invocation) (any, error) {
			// A sandbox error as adapters send it: the S-code, and the
			// contract's wire object as the message.
			var in struct {
				Fix bool `json:"fix"`
			}
			_ = json.Unmarshal(inv.Data, &in)
			if in.Fix {
				return nil, contract.ParentNotFound("/work/a/b.txt").ErrorBody()
			}
			return nil, contract.NewError(contract.S002, "sandbox sb-1 not found").ErrorBody()
		}},
		{w, client.FunctionDef{ID: "test::plainfail"}, func(context.Context, *client.Invocation) (any, error) {
			return nil, errors.New("boom")
		}},
		{w, client.FunctionDef{ID: "test::slow"}, func(ctx context.Context, inv *client.Invocation) (any, error) {
			// {"started": PATH} asks for a file once the call is in, so a
			// script can interrupt the caller at the right moment.
			var in struct {
				Started string `json:"started"`
			}
			if json.Unmarshal(inv.Data, &in) == nil && in.Started != "" {
				if err := os.WriteFile(in.Started, nil, 0o600); err != nil {
					return nil, err
				}
			}
			<-ctx.Done()
			return nil, ctx.Err()
		}},
		{w, client.FunctionDef{ID: "test::doc", Description: "Add two numbers.\nRounds as asked.",
			RequestSchema:  json.RawMessage(docRequestSchema),
			ResponseSchema: json.RawMessage(`{"type":"object","properties":{"sum":{"type":"number"}}}`)}, echo},
		{w, client.FunctionDef{ID: "test::progress", RequestSchema: json.RawMessage(progressRequestSchema)}, progressFn(w)},
		{dev, client.FunctionDef{ID: "dev::hello"}, func(context.Context, *client.Invocation) (any, error) {
			return "hello from dev", nil
		}},
	}
	for _, f := range fns {
		if _, err := f.c.RegisterFunction(f.def, f.h); err != nil {
			return err
		}
	}
	// Registrations are not acknowledged by the protocol: ask the engine
	// until it knows every function.
	for _, f := range fns {
		for {
			ns := f.c.Namespace()
			if ns == "" {
				ns = "default"
			}
			_, err := w.Call(ctx, "engine::functions::info", map[string]string{"function_id": f.def.ID, "namespace": ns})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("the engine never listed %s: %w", f.def.ID, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// echo returns the payload it got, minus the caller id the engine adds,
// with the members in the order they came.
func echo(_ context.Context, inv *client.Invocation) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(inv.Data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return inv.Data, nil
	}
	var out bytes.Buffer
	out.WriteByte('{')
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		if key == "_caller_worker_id" {
			continue
		}
		if out.Len() > 1 {
			out.WriteByte(',')
		}
		kb, _ := json.Marshal(key)
		out.Write(kb)
		out.WriteByte(':')
		out.Write(val)
	}
	out.WriteByte('}')
	return json.RawMessage(out.Bytes()), nil
}

// cmdExitCode runs a command and checks its exit status:
//
//	exitcode N prog args...
//
// stdout and stderr are kept for the next stdout/stderr checks.
func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exitcode N prog [args...]")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("%s: %v", args[1], err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited %d, want %d", strings.Join(args[1:], " "), got, want)
	}
}

// cmdCmpFrom compares the last command's stdout, from the first line that
// matches REGEX to the end, with FILE:
//
//	cmpfrom REGEX FILE
func cmdCmpFrom(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: cmpfrom REGEX FILE")
	}
	re, err := regexp.Compile("(?m)" + args[0])
	ts.Check(err)
	out := ts.ReadFile("stdout")
	loc := re.FindStringIndex(out)
	if loc == nil {
		ts.Fatalf("no line of stdout matches %q", args[0])
	}
	got, want := out[loc[0]:], ts.ReadFile(args[1])
	if got != want {
		ts.Fatalf("stdout from %q differs from %s:\n--- got\n%s--- want\n%s", args[0], args[1], got, want)
	}
}

// cmdWaitFile waits until FILE exists.
func cmdWaitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitfile FILE")
	}
	deadline := time.Now().Add(setupWait)
	for {
		if _, err := os.Stat(ts.MkAbs(args[0])); err == nil {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s never appeared", args[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cmdWaitPort waits until something accepts connections on 127.0.0.1:PORT.
func cmdWaitPort(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitport PORT")
	}
	deadline := time.Now().Add(setupWait)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", args[0]), time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("nothing listens on port %s: %v", args[0], err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
