// Command floodworker is a hostile project worker for the VM-worker
// acceptance test (tests/e2e): Compose runs it in a worker VM, where it
// reaches the engine only through the adapter's gateway forward, which
// adds the VM worker's engine credential on the host side. It serves
//
//   - floodworker::whoami: what the guest can see of its credential (it
//     holds none: the environment has no token) and the engine's refusal of
//     a call its credential does not grant, whose message names the
//     credential the connection carries; its pid and start time;
//   - floodworker::flood: starts a flood of the engine from inside the
//     guest (internal/testkit/flood: 60 MiB partial frames on /otel and
//     channel writers), answering at once;
//   - floodworker::result: the flood's outcome once it ended.
//
// It is built static (CGO_ENABLED=0) and needs nothing from the image.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/flood"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "floodworker:", err)
		os.Exit(1)
	}
}

// outcome is one flood's result, as floodworker::result reports it.
type outcome struct {
	Running   bool   `json:"running"`
	Offender  string `json:"offender,omitempty"`
	Violation string `json:"violation,omitempty"`
	Seconds   int    `json:"seconds,omitempty"`
}

func run(ctx context.Context) error {
	// whoami reports when this process started, so a test can tell the
	// same worker from one started again.
	startedAt := time.Now().UTC().Format(time.RFC3339Nano)
	url := os.Getenv("III_URL")
	if url == "" {
		return errors.New("III_URL is not set: run me as a Compose worker")
	}
	c, err := client.Dial(ctx, url, client.Options{Runtime: "go", CallTimeout: time.Minute})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", url, err)
	}
	defer c.Close(context.Background())

	var mu sync.Mutex
	var last *outcome
	if _, err := c.RegisterFunction(client.FunctionDef{ID: "floodworker::whoami"}, func(ctx context.Context, _ *client.Invocation) (any, error) {
		var tokenVars []string
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			if strings.Contains(k, "TOKEN") || strings.Contains(k, "CREDENTIAL") {
				tokenVars = append(tokenVars, k)
			}
		}
		sort.Strings(tokenVars)
		// A namespace the credential does not name: the refusal says which
		// credential the connection carries.
		_, err := c.Call(ctx, "nowhere::probe", map[string]any{}, client.WithNamespace("floodworker-elsewhere"))
		refusal := ""
		if err != nil {
			refusal = err.Error()
		}
		return map[string]any{"token_env": tokenVars, "refusal": refusal, "iii_url": url, "pid": os.Getpid(), "started_at": startedAt}, nil
	}); err != nil {
		return err
	}
	if _, err := c.RegisterFunction(client.FunctionDef{ID: "floodworker::flood"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		var in struct {
			Conns int `json:"conns"`
		}
		if err := json.Unmarshal(inv.Data, &in); err != nil || in.Conns < 1 || in.Conns > 64 {
			return nil, fmt.Errorf("floodworker::flood wants {conns: 1..64}, got %s", inv.Data)
		}
		mu.Lock()
		defer mu.Unlock()
		if last != nil && last.Running {
			return nil, errors.New("a flood is running already")
		}
		last = &outcome{Running: true}
		go func() {
			start := time.Now()
			// No token: the gateway forward presents the VM's credential.
			offender, violation := flood.PartialFrames(ctx, url, flood.Caller{Name: "VM worker (in the guest)"}, in.Conns)
			mu.Lock()
			last = &outcome{Offender: offender, Violation: violation, Seconds: int(time.Since(start).Seconds())}
			mu.Unlock()
		}()
		return map[string]any{"started": true}, nil
	}); err != nil {
		return err
	}
	if _, err := c.RegisterFunction(client.FunctionDef{ID: "floodworker::result"}, func(context.Context, *client.Invocation) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		if last == nil {
			return nil, errors.New("no flood was started")
		}
		return *last, nil
	}); err != nil {
		return err
	}
	fmt.Println("floodworker ready")
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.Done():
		return c.Err()
	}
}
