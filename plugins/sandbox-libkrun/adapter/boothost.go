package adapter

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
)

// bootHost is the Provider as the boot pipeline sees it (boot.Host): a
// type of its own so these methods do not join the Provider's API.
type bootHost Provider

var _ boot.Host = (*bootHost)(nil)

func (p *Provider) host() *bootHost { return (*bootHost)(p) }

func (h *bootHost) p() *Provider                { return (*Provider)(h) }
func (h *bootHost) Log() hclog.Logger           { return h.log }
func (h *bootHost) Executable() string          { return h.exe }
func (h *bootHost) Home() string                { return h.home }
func (h *bootHost) Now() time.Time              { return h.now() }
func (h *bootHost) Config() *config.Config      { return h.cfg }
func (h *bootHost) Current() *config.Config     { return h.p().current() }
func (h *bootHost) Images() *images.Store       { return h.store }
func (h *bootHost) Steps() boot.BootSteps       { return h.steps }
func (h *bootHost) Background() context.Context { return h.bg }
func (h *bootHost) Templates() *boot.Templates  { return h.templates }

func (h *bootHost) Selected(ctx context.Context) (*boot.Selection, error) {
	return h.p().selected(ctx)
}

// StopBooted stops a VM booted for nobody as a sandbox's stop does: the
// guest powers off, the runner goes, the state directory is removed.
func (h *bootHost) StopBooted(ctx context.Context, b *boot.Boot) error {
	return newSandbox(h.p(), b).Stop(ctx, true)
}
