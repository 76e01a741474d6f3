package sandboxkit

import (
	"context"

	"github.com/iii-sandbox/iii/contract"
)

// ReportProgress reports ev to the caller watching the create or run under
// way, if any (see contract.ProgressEvent); without one it does nothing.
// Providers call it from Boot with the phases they go through (pulling,
// unpacking, building, booting); the kit fills in image and image_ref
// when they are empty and reports ready itself. It never blocks.
func ReportProgress(ctx context.Context, ev contract.ProgressEvent) {
	contract.ReportProgress(ctx, ev)
}

// withImage makes progress reported under ctx name img unless the reporter
// named an image itself.
func withImage(ctx context.Context, img contract.CatalogImage) context.Context {
	parent := contract.ProgressFrom(ctx)
	if parent == nil {
		return ctx
	}
	return contract.WithProgress(ctx, func(ev contract.ProgressEvent) {
		if ev.Image == "" {
			ev.Image = img.Name
		}
		if ev.ImageRef == "" {
			ev.ImageRef = img.OCIRef
		}
		parent(ev)
	})
}
