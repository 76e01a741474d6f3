package state

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/iii-sandbox/iii/workers/workerkit"
)

// Spec is the worker's workerkit.Spec.
func Spec() workerkit.Spec {
	return workerkit.Spec{Name: Name, Version: Version, DefaultConfig: json.RawMessage(DefaultConfig),
		Description: "iii state: scoped key/value store with change triggers"}
}

// Run is the worker's life under workerkit: open the store from the
// configuration file, connect, serve, follow the configuration entry,
// and on ctx's end save and close the store.
func Run(ctx context.Context, k *workerkit.Kit) error {
	routeRedisLogs(k.Log)
	cfg, err := ParseConfig(k.FileConfig())
	if err != nil {
		return err
	}
	w, err := New(ctx, cfg, Options{Logger: k.Log, BaseDir: k.Env.BaseDir()})
	if err != nil {
		return err
	}
	k.Log.Info("state store", "store", w.spec.String(), "version", Version)
	defer func() {
		if err := w.Close(context.Background()); err != nil {
			k.Log.Error("close the state store", "error", err)
		}
	}()
	if err := k.Connect(ctx); err != nil {
		return err
	}
	w.invoker = ClientInvoker{C: k.Client}
	if err := w.Register(k.Client); err != nil {
		return fmt.Errorf("register the state functions: %w", err)
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
