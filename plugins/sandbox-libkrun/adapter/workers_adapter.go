package adapter

import (
	"context"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/workervm"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

var _ contract.WorkerAdapter = (*Adapter)(nil)

// Info is the kit's adapter::info, announcing the worker::* functions.
func (a *Adapter) Info(ctx context.Context) (*contract.AdapterInfo, error) {
	info, err := a.Manager.Info(ctx)
	if err != nil || info == nil {
		return info, err
	}
	out := *info
	out.Capabilities = append(append([]string{}, info.Capabilities...), contract.CapabilityWorker)
	return &out, nil
}

// Configure is the kit's, and then hands the worker VMs what the kit's
// keys decide for them: whether images may be pulled (auto_install) and
// the catalog image names resolve against.
func (a *Adapter) Configure(ctx context.Context, configJSON []byte) error {
	if err := a.Manager.Configure(ctx, configJSON); err != nil {
		return err
	}
	kit, _, err := sandboxkit.ParseConfig(configJSON, a.provider.Presets(), config.ConfigKeys())
	if err != nil {
		// The Manager accepted the same document; this cannot differ.
		return err
	}
	ws, err := a.provider.workerSet()
	if err != nil {
		return err
	}
	ws.SetKit(kit.AutoInstall, func(ctx context.Context) []contract.CatalogImage {
		c, err := a.Manager.CatalogList(ctx, &contract.CatalogListRequest{})
		if err != nil {
			return nil
		}
		return c.Images
	})
	return nil
}

// workerSet returns the worker VMs, once configured.
func (p *Provider) workerSet() (*workervm.Set, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.workers == nil {
		return nil, contract.NewError(contract.S301, "the sandbox adapter %q has not been configured yet (the engine configures it right after starting it); retry in a moment", Name)
	}
	return p.workers, nil
}

// WorkerStart implements contract.WorkerAdapter.
func (a *Adapter) WorkerStart(ctx context.Context, req *contract.WorkerStartRequest) (*contract.WorkerStartResponse, error) {
	ws, err := a.provider.workerSet()
	if err != nil {
		return nil, err
	}
	return ws.Start(ctx, req)
}

// WorkerStop implements contract.WorkerAdapter.
func (a *Adapter) WorkerStop(ctx context.Context, req *contract.WorkerStopRequest) (*contract.WorkerStatus, error) {
	ws, err := a.provider.workerSet()
	if err != nil {
		return nil, err
	}
	return ws.Stop(ctx, req)
}

// WorkerStatus implements contract.WorkerAdapter.
func (a *Adapter) WorkerStatus(_ context.Context, req *contract.WorkerStatusRequest) (*contract.WorkerStatus, error) {
	ws, err := a.provider.workerSet()
	if err != nil {
		return nil, err
	}
	return ws.Status(req.VMID)
}

// WorkerList implements contract.WorkerAdapter.
func (a *Adapter) WorkerList(context.Context, *contract.WorkerListRequest) (*contract.WorkerListResponse, error) {
	ws, err := a.provider.workerSet()
	if err != nil {
		return nil, err
	}
	return ws.List()
}

// WorkerLogs implements contract.WorkerAdapter.
func (a *Adapter) WorkerLogs(_ context.Context, req *contract.WorkerLogsRequest) (*contract.WorkerLogsResponse, error) {
	ws, err := a.provider.workerSet()
	if err != nil {
		return nil, err
	}
	return ws.Logs(req)
}

// WorkerRemove implements contract.WorkerAdapter.
func (a *Adapter) WorkerRemove(ctx context.Context, req *contract.WorkerRemoveRequest) (*contract.WorkerRemoveResponse, error) {
	ws, err := a.provider.workerSet()
	if err != nil {
		return nil, err
	}
	return ws.Remove(ctx, req)
}
