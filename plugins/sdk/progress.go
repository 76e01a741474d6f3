package sdk

import (
	"context"

	"github.com/iii-sandbox/iii/contract"
)

// Progress returns where an operation reports its progress: a caller of
// sandbox::create or sandbox::run may pass a channel to watch the sandbox
// start in (contract.ProgressEvent), and Serve's transport puts a sink for
// it in the operation's context. Without one the returned function does
// nothing, so an adapter reports unconditionally:
//
//	report := sdk.Progress(ctx)
//	report(contract.ProgressEvent{Phase: contract.ProgressBooting, Image: img.Name, ImageRef: img.OCIRef})
//
// The function never blocks; a burst of same-phase events may be
// coalesced on the way. Adapters built on sandboxkit can use
// sandboxkit.ReportProgress instead, which also fills in the image.
func Progress(ctx context.Context) contract.ProgressSink {
	if s := contract.ProgressFrom(ctx); s != nil {
		return s
	}
	return func(contract.ProgressEvent) {}
}
