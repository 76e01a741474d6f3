package httpworker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

// FnConfigurationID is upstream's http::configuration-id: {} → {id}.
const FnConfigurationID = "http::configuration-id"

// shutdownWait bounds the wait for requests in flight at SIGTERM.
const shutdownWait = 10 * time.Second

// Spec is the worker's workerkit.Spec.
func Spec() workerkit.Spec {
	return workerkit.Spec{Name: Name, Version: Version, DefaultConfig: json.RawMessage(DefaultConfig),
		Description: "iii http: the http trigger type, routes served on its own listener"}
}

// Run is the worker's life under workerkit: parse the configuration, bind
// the listener (a port in use stops the start), connect, provide the
// `http` trigger type, follow the configuration entry, and on ctx's end
// drain the listener.
func Run(ctx context.Context, k *workerkit.Kit) error {
	cfg, err := ParseConfig(k.FileConfig())
	if err != nil {
		return err
	}
	w := New(cfg, Options{Logger: k.Log})
	if err := w.Listen(); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
		defer cancel()
		if err := w.Close(sctx); err != nil {
			k.Log.Warn("http listener shutdown", "error", err)
		}
	}()
	if err := k.Connect(ctx); err != nil {
		return err
	}
	w.SetInvoker(ClientInvoker{C: k.Client})
	if cfg.StreamingOn() {
		w.SetStreams(NewClientStreams(k.Client, k.Log))
	}
	if err := w.Register(k.Client, k.Env.EntryID()); err != nil {
		return fmt.Errorf("register the http trigger type: %w", err)
	}
	if err := k.WatchConfig(ctx, func(_ context.Context, raw json.RawMessage) error {
		c, err := ParseConfig(raw)
		if err != nil {
			return err
		}
		w.Reconfigure(c)
		return nil
	}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// Register provides the `http` trigger type and http::configuration-id on c.
func (w *Worker) Register(c *client.Client, entryID string) error {
	if _, err := c.RegisterTriggerType(client.TriggerTypeDef{ID: TriggerType,
		Description:          "HTTP routes: api_path, http_method, condition_function_id, middleware_function_ids",
		TriggerRequestSchema: json.RawMessage(triggerSchema),
	}, w); err != nil {
		return err
	}
	_, err := c.RegisterFunction(client.FunctionDef{ID: FnConfigurationID, Description: "The http worker's configuration entry id",
		RequestSchema:  json.RawMessage(`{"type":"object"}`),
		ResponseSchema: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string"}}}`),
	}, func(context.Context, *client.Invocation) (any, error) {
		return map[string]string{"id": entryID}, nil
	})
	return err
}

const triggerSchema = `{"type":"object","required":["api_path"],"properties":{` +
	`"api_path":{"type":"string"},"http_method":{"type":"string"},` +
	`"condition_function_id":{"type":"string"},` +
	`"middleware_function_ids":{"type":"array","items":{"type":"string"}}}}`
