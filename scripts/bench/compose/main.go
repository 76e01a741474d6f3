// Command compose measures `iii compose --up` of a 10-worker project, from
// the moment the command starts until every worker is ready, beside the
// floor measured in the same run on the same machine: an engine started by
// hand (`iii -c`) and the same ten Node iii-sdk worker processes started
// by hand at once, timed until the engine lists all ten in the namespace.
//
//	A  iii compose --up: the managed engine, the reaper, ten workers in one
//	   wave (at most 8 starting at a time), readiness polled every 200 ms
//	F  iii -c config.yaml + the ten `node worker.mjs` processes, polling
//	   engine::workers::list every 5 ms (the floor)
//
// Rounds alternate A and F so machine load moves both alike; the medians
// and A/F are printed. Needs node and the iii-sdk package (make
// setup-test).
//
//	go run ./scripts/bench/compose [-rounds 5] [-workers 10]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
)

func main() {
	rounds := flag.Int("rounds", 5, "measured rounds of each path")
	workers := flag.Int("workers", 10, "workers in the project")
	flag.Parse()
	if err := run(*rounds, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "compose bench:", err)
		os.Exit(1)
	}
}

type env struct {
	iii, node, worker, sdkURL, tmp string
}

func setup() (*env, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root, err := bins.RepoRoot(wd)
	if err != nil {
		return nil, err
	}
	sdk, err := nodesdk.Locate(root)
	if err != nil {
		return nil, err
	}
	// Unix sockets and Node need short, real paths.
	tmp, err := os.MkdirTemp("", "cb")
	if err != nil {
		return nil, err
	}
	iii := filepath.Join(tmp, "iii")
	build := exec.Command("go", "build", "-o", iii, "./cmd/iii")
	build.Dir, build.Stderr = root, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build iii: %w", err)
	}
	return &env{iii: iii, node: sdk.Node, worker: filepath.Join(root, "compose", "daemon", "testdata", "node", "worker.mjs"),
		sdkURL: sdk.URL, tmp: tmp}, nil
}

func run(rounds, n int) error {
	e, err := setup()
	if err != nil {
		return err
	}
	defer os.RemoveAll(e.tmp)
	var a, f []time.Duration
	for i := 0; i < rounds+1; i++ {
		da, err := e.composeUp(i, n)
		if err != nil {
			return fmt.Errorf("compose --up: %w", err)
		}
		df, err := e.byHand(i, n)
		if err != nil {
			return fmt.Errorf("by hand: %w", err)
		}
		if i == 0 {
			continue // warm-up: caches, page cache, node's compile cache
		}
		a, f = append(a, da), append(f, df)
	}
	ma, mf := benchstat.Median(a), benchstat.Median(f)
	fmt.Printf("compose --up, %d Node workers to all ready (median of %d)\n", n, rounds)
	fmt.Printf("  A  iii compose --up                 %8.1f ms\n", ms(ma))
	fmt.Printf("  F  iii -c + workers by hand (floor) %8.1f ms\n", ms(mf))
	fmt.Printf("  A/F                                 %8.2f\n", float64(ma)/float64(mf))
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// composeUp times `iii compose --up` until it prints that the project is
// up, then stops it with SIGINT.
func (e *env) composeUp(round, n int) (time.Duration, error) {
	port, err := loopback.FreePort()
	if err != nil {
		return 0, err
	}
	dir := filepath.Join(e.tmp, "a"+strconv.Itoa(round))
	var b strings.Builder
	fmt.Fprintf(&b, "namespace: bench\nengine:\n  url: ws://127.0.0.1:%d\n  workers: {}\ncontainers:\n", port)
	for i := range n {
		key := fmt.Sprintf("w%02d", i)
		if err := os.MkdirAll(filepath.Join(dir, key), 0o755); err != nil {
			return 0, err
		}
		fmt.Fprintf(&b, "  %s:\n    worker: path://./%s\n    scripts: { run: '%s %s' }\n    environment: { III_SDK_URL: '%s' }\n",
			key, key, e.node, e.worker, e.sdkURL)
	}
	if err := os.WriteFile(filepath.Join(dir, "worker-compose.yaml"), []byte(b.String()), 0o644); err != nil {
		return 0, err
	}
	cmd := exec.Command(e.iii, "compose", "--up")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+e.tmp)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(out)
	var took time.Duration
	for sc.Scan() {
		if strings.HasSuffix(sc.Text(), fmt.Sprintf("is up (%d containers)", n)) {
			took = time.Since(start)
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	go func() {
		for sc.Scan() {
		}
	}()
	werr := cmd.Wait()
	if took == 0 {
		return 0, fmt.Errorf("the project did not come up (%v)", werr)
	}
	return took, nil
}

// byHand starts an engine and the same worker processes itself and polls
// the engine until every worker is registered in the namespace.
func (e *env) byHand(round, n int) (time.Duration, error) {
	port, err := loopback.FreePort()
	if err != nil {
		return 0, err
	}
	dir := filepath.Join(e.tmp, "f"+strconv.Itoa(round))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	cfg := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n  - name: configuration\n    config: { adapter: { name: fs, config: { directory: %s } } }\n",
		port, filepath.Join(dir, "config"))
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o644); err != nil {
		return 0, err
	}
	engineURL := fmt.Sprintf("ws://127.0.0.1:%d", port)
	start := time.Now()
	eng := exec.Command(e.iii, "-c", "config.yaml")
	eng.Dir = dir
	if err := eng.Start(); err != nil {
		return 0, err
	}
	defer func() {
		_ = eng.Process.Signal(syscall.SIGINT)
		_ = eng.Wait()
	}()
	for {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			break
		}
		if time.Since(start) > time.Minute {
			return 0, fmt.Errorf("the engine did not listen")
		}
		time.Sleep(2 * time.Millisecond)
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
	}()
	for i := range n {
		key := fmt.Sprintf("w%02d", i)
		p := exec.Command(e.node, e.worker)
		p.Dir = dir
		p.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + e.tmp, "III_URL=" + engineURL, "III_NAMESPACE=bench",
			"III_WORKER_NAME=" + key, "III_SDK_URL=" + e.sdkURL, "III_ISOLATION=host"}
		if err := p.Start(); err != nil {
			return 0, err
		}
		procs = append(procs, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, engineURL, client.Options{Name: "bench-poller", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	for {
		raw, err := c.Call(ctx, "engine::workers::list", map[string]any{})
		if err != nil {
			return 0, err
		}
		var out struct {
			Workers []struct {
				Name      *string `json:"name"`
				Namespace string  `json:"namespace"`
			} `json:"workers"`
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return 0, err
		}
		ready := 0
		for _, w := range out.Workers {
			if w.Namespace == "bench" && w.Name != nil && strings.HasPrefix(*w.Name, "w") {
				ready++
			}
		}
		if ready == n {
			return time.Since(start), nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}
