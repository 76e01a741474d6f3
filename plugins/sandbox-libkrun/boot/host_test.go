package boot

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
)

// testHost is a Host with what a test sets; the rest is zero.
type testHost struct {
	log       hclog.Logger
	cfg       *config.Config
	steps     BootSteps
	templates *Templates
	sel       *Selection
	stopped   []*Boot
}

var _ Host = (*testHost)(nil)

func (h *testHost) Log() hclog.Logger {
	if h.log == nil {
		return hclog.NewNullLogger()
	}
	return h.log
}
func (h *testHost) Executable() string          { return "" }
func (h *testHost) Home() string                { return "" }
func (h *testHost) Now() time.Time              { return time.Now() }
func (h *testHost) Config() *config.Config      { return h.cfg }
func (h *testHost) Current() *config.Config     { return h.cfg }
func (h *testHost) Images() *images.Store       { return nil }
func (h *testHost) Steps() BootSteps            { return h.steps }
func (h *testHost) Background() context.Context { return context.Background() }
func (h *testHost) Templates() *Templates       { return h.templates }
func (h *testHost) Selected(context.Context) (*Selection, error) {
	return h.sel, nil
}
func (h *testHost) StopBooted(_ context.Context, b *Boot) error {
	h.stopped = append(h.stopped, b)
	return nil
}
