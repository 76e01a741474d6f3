package sdk

import (
	"context"

	"github.com/iii-sandbox/iii/contract"
)

// sandbox::pause and sandbox::resume pass through Serve like the
// contract's operations (a panic becomes an S-code error), for adapters
// that implement contract.PauseAdapter and announce contract.CapabilityPause
// in Info. Any other adapter answers them with S006.

var _ contract.PauseAdapter = (*servedAdapter)(nil)

func (a *servedAdapter) pauser(op string) (contract.PauseAdapter, error) {
	if p, ok := a.inner.(contract.PauseAdapter); ok {
		return p, nil
	}
	return nil, contract.PauseUnsupported(a.cfg.Name, op)
}

func (a *servedAdapter) Pause(ctx context.Context, req *contract.PauseRequest) (out *contract.SandboxStatus, err error) {
	defer a.recovered(contract.OpPause, &err)
	p, err := a.pauser(contract.OpPause)
	if err != nil {
		return nil, err
	}
	return p.Pause(ctx, req)
}

func (a *servedAdapter) Resume(ctx context.Context, req *contract.ResumeRequest) (out *contract.SandboxStatus, err error) {
	defer a.recovered(contract.OpResume, &err)
	p, err := a.pauser(contract.OpResume)
	if err != nil {
		return nil, err
	}
	return p.Resume(ctx, req)
}
