package sdk

import (
	"context"

	"github.com/iii-sandbox/iii/contract"
)

// The worker::* functions pass through Serve like the contract's
// operations (a panic becomes an S-code error), for adapters that
// implement contract.WorkerAdapter and announce contract.CapabilityWorker
// in Info. Any other adapter answers them with S300.

var _ contract.WorkerAdapter = (*servedAdapter)(nil)

func (a *servedAdapter) workers(op string) (contract.WorkerAdapter, error) {
	if w, ok := a.inner.(contract.WorkerAdapter); ok {
		return w, nil
	}
	return nil, Errorf(contract.S300, "the sandbox adapter %s does not run worker VMs (%s)", a.cfg.Name, op)
}

func (a *servedAdapter) WorkerStart(ctx context.Context, req *contract.WorkerStartRequest) (out *contract.WorkerStartResponse, err error) {
	defer a.recovered(contract.OpWorkerStart, &err)
	w, err := a.workers(contract.OpWorkerStart)
	if err != nil {
		return nil, err
	}
	return w.WorkerStart(ctx, req)
}

func (a *servedAdapter) WorkerStop(ctx context.Context, req *contract.WorkerStopRequest) (out *contract.WorkerStatus, err error) {
	defer a.recovered(contract.OpWorkerStop, &err)
	w, err := a.workers(contract.OpWorkerStop)
	if err != nil {
		return nil, err
	}
	return w.WorkerStop(ctx, req)
}

func (a *servedAdapter) WorkerStatus(ctx context.Context, req *contract.WorkerStatusRequest) (out *contract.WorkerStatus, err error) {
	defer a.recovered(contract.OpWorkerStatus, &err)
	w, err := a.workers(contract.OpWorkerStatus)
	if err != nil {
		return nil, err
	}
	return w.WorkerStatus(ctx, req)
}

func (a *servedAdapter) WorkerList(ctx context.Context, req *contract.WorkerListRequest) (out *contract.WorkerListResponse, err error) {
	defer a.recovered(contract.OpWorkerList, &err)
	w, err := a.workers(contract.OpWorkerList)
	if err != nil {
		return nil, err
	}
	return w.WorkerList(ctx, req)
}

func (a *servedAdapter) WorkerLogs(ctx context.Context, req *contract.WorkerLogsRequest) (out *contract.WorkerLogsResponse, err error) {
	defer a.recovered(contract.OpWorkerLogs, &err)
	w, err := a.workers(contract.OpWorkerLogs)
	if err != nil {
		return nil, err
	}
	return w.WorkerLogs(ctx, req)
}

func (a *servedAdapter) WorkerRemove(ctx context.Context, req *contract.WorkerRemoveRequest) (out *contract.WorkerRemoveResponse, err error) {
	defer a.recovered(contract.OpWorkerRemove, &err)
	w, err := a.workers(contract.OpWorkerRemove)
	if err != nil {
		return nil, err
	}
	return w.WorkerRemove(ctx, req)
}
