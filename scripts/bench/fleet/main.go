// Command fleet measures what routing through the fleet layer adds to a
// sandbox call (issue 14): two engines (iii built from this tree) run side
// by side, each with one remote sandbox-hostdir adapter connected over
// WebSocket:
//
//	S  the single-host path: sandbox: {adapter: sandbox-hostdir}, the
//	   adapter serving <adapter>::<op>
//	F  the fleet path: sandbox: {adapter: sandbox-hostdir, hosts: '*'},
//	   the adapter serving as host h1 (--fleet)
//
// and a caller times sandbox::exec (`true`) and sandbox::fs::stat on one
// sandbox of each, in interleaved blocks so machine load moves a figure and
// its floor alike. S is the floor; the goal is F ≤ 1.2 × S at p50.
//
//	go run ./scripts/bench/fleet [-n 1000] [-block 50]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/enginetoken"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fleet bench:", err)
		os.Exit(1)
	}
}

type path struct {
	name    string
	caller  *client.Client
	sandbox string
	exec    []time.Duration
	stat    []time.Duration
}

func run() error {
	n := flag.Int("n", 1000, "calls per operation and path")
	block := flag.Int("block", 50, "consecutive calls per block")
	flag.Parse()
	ctx := context.Background()
	work, err := os.MkdirTemp("/tmp", "fleetb")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	// Apart: an engine finds (and starts) an adapter that sits beside it.
	iii, adapterBin := filepath.Join(work, "engine", "iii"), filepath.Join(work, "adapter", "sandbox-hostdir")
	for _, b := range []struct{ out, pkg string }{{iii, "./cmd/iii"}, {adapterBin, "./plugins/sdk/examples/hostdir/cmd/sandbox-hostdir"}} {
		if out, err := bins.GoBuild(b.out, b.pkg, nil); err != nil {
			return fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	token, err := enginetoken.New()
	if err != nil {
		return err
	}
	cred := filepath.Join(work, "token")
	if err := os.WriteFile(cred, []byte(token), 0o600); err != nil {
		return err
	}
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	start := func(name, sandboxExtra string, adapterArgs ...string) (*path, error) {
		dir := filepath.Join(work, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		port, err := loopback.FreePort()
		if err != nil {
			return nil, err
		}
		cfg := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\nsandbox:\n  adapter: %s\n%s", port, hostdir.Name, sandboxExtra)
		if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o600); err != nil {
			return nil, err
		}
		eng := exec.Command(iii, "-c", filepath.Join(dir, "config.yaml"))
		eng.Dir, eng.Env = dir, append(os.Environ(), "HOME="+dir, "III_ENGINE_TOKEN="+token, "III_PLUGIN_PATH=")
		if err := eng.Start(); err != nil {
			return nil, err
		}
		stops = append(stops, func() { _ = eng.Process.Kill(); _ = eng.Wait() })
		url := fmt.Sprintf("ws://127.0.0.1:%d", port)
		adapterCfg := filepath.Join(dir, "adapter.json")
		if err := os.WriteFile(adapterCfg, []byte(`{"image_allowlist":["shell"]}`), 0o600); err != nil {
			return nil, err
		}
		ad := exec.Command(adapterBin, append([]string{"serve", "--engine", url, "--credential-file", cred, "--config-file", adapterCfg}, adapterArgs...)...)
		ad.Env = append(os.Environ(), hostdir.EnvStateDir+"="+filepath.Join(dir, "state"))
		if err := ad.Start(); err != nil {
			return nil, err
		}
		stops = append(stops, func() { _ = ad.Process.Kill(); _ = ad.Wait() })
		var c *client.Client
		var id string
		deadline := time.Now().Add(time.Minute)
		for {
			if c == nil {
				dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				c, _ = client.Dial(dctx, url, client.Options{Name: "fleet-bench", IgnoreEnv: true, Token: token, Reconnect: client.ReconnectPolicy{Disable: true}})
				cancel()
			}
			if c != nil {
				if raw, err := c.Call(ctx, "sandbox::create", map[string]any{"image": "shell"}); err == nil {
					var created contract.CreateResponse
					if err := json.Unmarshal(raw, &created); err != nil {
						return nil, err
					}
					id = created.SandboxID
					break
				}
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%s: no sandbox after a minute", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
		stops = append(stops, func() { _ = c.Close(context.Background()) })
		return &path{name: name, caller: c, sandbox: id}, nil
	}
	single, err := start("single", "")
	if err != nil {
		return err
	}
	fleet, err := start("fleet", "  hosts: '*'\n", "--host-name", "h1", "--fleet")
	if err != nil {
		return err
	}
	paths := []*path{single, fleet}
	callOnce := func(p *path, fn string, payload any) (time.Duration, error) {
		t := time.Now()
		_, err := p.caller.Call(ctx, fn, payload)
		return time.Since(t), err
	}
	for done := -100; done < *n; done += *block { // the first blocks warm up
		for _, p := range paths {
			for range *block {
				d, err := callOnce(p, "sandbox::exec", map[string]any{"sandbox_id": p.sandbox, "argv": []string{"true"}})
				if err != nil {
					return fmt.Errorf("%s exec: %w", p.name, err)
				}
				if done >= 0 {
					p.exec = append(p.exec, d)
				}
				d, err = callOnce(p, "sandbox::fs::stat", map[string]any{"sandbox_id": p.sandbox, "path": "/"})
				if err != nil {
					return fmt.Errorf("%s stat: %w", p.name, err)
				}
				if done >= 0 {
					p.stat = append(p.stat, d)
				}
			}
		}
	}
	fmt.Printf("fleet routing overhead, %d calls per operation and path (interleaved blocks of %d)\n", len(single.exec), *block)
	for _, op := range []struct {
		name string
		get  func(*path) []time.Duration
	}{{"sandbox::exec true", func(p *path) []time.Duration { return p.exec }}, {"sandbox::fs::stat", func(p *path) []time.Duration { return p.stat }}} {
		s50, f50 := benchstat.Percentile(op.get(single), 50), benchstat.Percentile(op.get(fleet), 50)
		s99, f99 := benchstat.Percentile(op.get(single), 99), benchstat.Percentile(op.get(fleet), 99)
		verdict := "met"
		if f50.Seconds() > 1.2*s50.Seconds() {
			verdict = "NOT met"
		}
		fmt.Printf("  %-20s fleet p50 %8s p99 %8s | floor single-host p50 %8s p99 %8s | ratio p50 %.2fx p99 %.2fx (goal p50 <= 1.2x: %s)\n",
			op.name, f50.Round(time.Microsecond), f99.Round(time.Microsecond), s50.Round(time.Microsecond), s99.Round(time.Microsecond),
			f50.Seconds()/s50.Seconds(), f99.Seconds()/s99.Seconds(), verdict)
	}
	return nil
}
