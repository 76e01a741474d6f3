package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
)

// composeWait bounds the waits of the Compose scripts (Node workers and
// adapters take a moment to start); a safety net, not a timing.
const composeWait = 90 * time.Second

// composeBins builds the adapters the scripts run, once per test binary.
var composeBins struct {
	sync.Mutex
	dir string
	err error
}

func adapterDir() (string, error) {
	composeBins.Lock()
	defer composeBins.Unlock()
	if composeBins.dir != "" || composeBins.err != nil {
		return composeBins.dir, composeBins.err
	}
	dir, err := os.MkdirTemp("", "iii-compose-adapters-")
	if err != nil {
		composeBins.err = err
		return "", err
	}
	for name, pkg := range map[string]string{
		"sandbox-hostdir": "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir",
		"sandbox-libkrun": "github.com/iii-sandbox/iii/plugins/sandbox-libkrun/cmd/sandbox-libkrun",
	} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg).CombinedOutput()
		if err != nil {
			composeBins.err = fmt.Errorf("build %s: %v\n%s", name, err, out)
			return "", composeBins.err
		}
	}
	// A directory registry with both adapters, as `make build` publishes
	// bin/registry: the scripts' package:// workers resolve from it
	// ($III_REGISTRY).
	reg := filepath.Join(dir, "registry")
	for _, p := range []registry.Publication{
		{Name: "sandbox-libkrun", Version: "0.3.1", Files: []registry.PublishFile{{Path: filepath.Join(dir, "sandbox-libkrun")}},
			DefaultConfig: json.RawMessage(`{"auto_install":true,"default_cpus":1,"default_idle_timeout_secs":300,"default_memory_mb":512,"image_allowlist":["python","node"],"max_concurrent_sandboxes":32}`)},
		{Name: "sandbox-hostdir", Version: "1.0.0", Files: []registry.PublishFile{{Path: filepath.Join(dir, "sandbox-hostdir")}}},
	} {
		p.Kind, p.Target, p.Tags, p.Now = registry.KindBinary, registry.HostPlatform().Target(), []string{registry.TagLatest}, time.Now()
		if _, err := registry.Publish(reg, p); err != nil {
			composeBins.err = fmt.Errorf("publish %s: %v", p.Name, err)
			return "", composeBins.err
		}
	}
	composeBins.dir = dir
	return dir, nil
}

// removeAdapterDir removes what adapterDir built, once every test has run
// (it serves every run of -count).
func removeAdapterDir() {
	composeBins.Lock()
	defer composeBins.Unlock()
	if composeBins.dir != "" {
		_ = os.RemoveAll(composeBins.dir)
	}
}

// TestComposeScripts runs testdata/compose/*.txtar: `iii compose` for real
// (managed engines, attached engines, Node iii-sdk workers, the sandbox
// adapters through the engine's plugin host). Variables:
//
//	FREE_PORT, FREE_PORT2  loopback ports free for engines the script starts
//	III_SDK_URL            the Node SDK's entry point (file URL)
//	NODE_WORKER            the command that runs the Node test worker
//	PLUGINS                sandbox-hostdir and sandbox-libkrun (also $III_PLUGIN_PATH)
//	III_REGISTRY           $PLUGINS/registry: sandbox-libkrun 0.3.1, sandbox-hostdir 1.0.0
//	TARGET                 this host's target triple
func TestComposeScripts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the Compose scripts start engines, adapters and Node workers")
	}
	plugins, err := adapterDir()
	if err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(filepath.Dir(wd))
	sdk, sdkErr := nodesdk.Locate(wd)
	hasNode := sdkErr == nil
	testscript.Run(t, testscript.Params{
		Dir: "testdata/compose",
		Setup: func(e *testscript.Env) error {
			for _, name := range []string{"FREE_PORT", "FREE_PORT2"} {
				p, err := freePort()
				if err != nil {
					return err
				}
				e.Setenv(name, p)
			}
			// sandbox-libkrun keeps unix sockets under ~/.iii/sandbox, and
			// socket paths are short: $WORK is too deep for a home.
			home, err := os.MkdirTemp("", "h")
			if err != nil {
				return err
			}
			e.Defer(func() { _ = os.RemoveAll(home) })
			e.Setenv("HOME", home)
			e.Setenv("PLUGINS", plugins)
			e.Setenv("III_REGISTRY", filepath.Join(plugins, "registry"))
			e.Setenv("TARGET", registry.HostPlatform().Target())
			e.Setenv("III_PLUGIN_PATH", plugins)
			e.Setenv("III_SDK_URL", sdk.URL)
			e.Setenv("NODE_WORKER", sdk.Node+" "+filepath.Join(root, "compose", "daemon", "testdata", "node", "worker.mjs"))
			return nil
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "node":
				return hasNode, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"exitcode":    cmdExitCode,
			"waitport":    cmdWaitPort,
			"waitcompose": cmdWaitCompose,
			"waitstate":   cmdWaitState,
			"noprocs":     cmdNoProcs,
			"perm":        cmdPerm,
		},
	})
}

// composeCall calls fn in ns on the engine at 127.0.0.1:port.
func composeCall(ctx context.Context, port, ns, fn string, payload any) (json.RawMessage, error) {
	c, err := client.Dial(ctx, "ws://127.0.0.1:"+port, client.Options{Name: "compose-script-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	return c.Call(ctx, fn, payload, client.WithNamespace(ns), client.WithTimeout(10*time.Second))
}

// cmdWaitCompose waits until a Compose daemon serves NS on the engine at
// PORT:
//
//	waitcompose NS PORT
func cmdWaitCompose(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitcompose NS PORT")
	}
	deadline := time.Now().Add(composeWait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := composeCall(ctx, args[1], args[0], "compose::list", nil)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("no Compose daemon serves %s on port %s: %v", args[0], args[1], err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cmdWaitState waits until compose::status (of the daemon's default file)
// reports CONTAINER in STATE:
//
//	waitstate NS PORT CONTAINER STATE
func cmdWaitState(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 4 {
		ts.Fatalf("usage: waitstate NS PORT CONTAINER STATE")
	}
	deadline := time.Now().Add(composeWait)
	last := ""
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		raw, err := composeCall(ctx, args[1], args[0], "compose::status", nil)
		cancel()
		if err == nil {
			var st struct {
				Containers []struct {
					Container string `json:"container"`
					State     string `json:"state"`
					Owned     bool   `json:"owned"`
				} `json:"containers"`
			}
			if json.Unmarshal(raw, &st) == nil {
				for _, c := range st.Containers {
					if c.Container == args[2] {
						last = c.State
						// A project whose up is still under way is reported
						// from the engine's worker list (owned:false): its
						// containers count only once this daemon owns them.
						if !c.Owned {
							last += " (not owned yet)"
						}
					}
				}
			}
		} else {
			last = err.Error()
		}
		if last == args[3] {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("container %s never reached %s (last: %s)", args[2], args[3], last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cmdNoProcs waits until no process but the test's own runs with its
// working directory in $WORK: Compose, its reaper, its engine, the
// engine's adapters and the workers all run there (Linux only):
//
//	noprocs
//	! noprocs   (some do run now)
func cmdNoProcs(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 0 {
		ts.Fatalf("usage: noprocs")
	}
	if runtime.GOOS != "linux" {
		ts.Fatalf("noprocs reads /proc")
	}
	work := ts.Getenv("WORK")
	scan := func() []string {
		ents, _ := os.ReadDir("/proc")
		var found []string
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
			if err != nil || (cwd != work && !strings.HasPrefix(cwd, work+"/")) {
				continue
			}
			stat, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
			if strings.Contains(string(stat), ") Z ") {
				continue // exited, waiting for its parent to collect it
			}
			cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			found = append(found, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(strings.TrimSpace(string(cmd)), "\x00", " ")))
		}
		return found
	}
	if neg {
		if len(scan()) == 0 {
			ts.Fatalf("no process runs in %s", work)
		}
		return
	}
	deadline := time.Now().Add(composeWait)
	for {
		found := scan()
		if len(found) == 0 {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("processes still run in %s:\n%s", work, strings.Join(found, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cmdPerm checks a file's permission bits:
//
//	perm FILE 0600
func cmdPerm(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: perm FILE MODE")
	}
	want, err := strconv.ParseUint(args[1], 8, 32)
	ts.Check(err)
	st, err := os.Stat(ts.MkAbs(args[0]))
	ts.Check(err)
	if got := st.Mode().Perm(); got != os.FileMode(want) {
		ts.Fatalf("%s has mode %04o, want %04o", args[0], got, want)
	}
}
