package boot

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// poolRetryDelay is how long the pool waits after a failed boot before it
// boots again (a missing image or a broken back end fails every time).
const poolRetryDelay = 5 * time.Second

// WarmPool keeps booted, agent-ready VMs per image in the default shape
// (default cpus and memory, no network). A pooled VM is not a sandbox
// until a create claims it: the kit neither lists nor counts it. One VM
// boots at a time, in the background.
type WarmPool struct {
	h Host
	// discard stops a ready VM the pool no longer wants (a reload shrank
	// or reshaped it); tests replace it.
	discard func(*Boot)
	// discards counts the discards under way, for shutdown.
	discards sync.WaitGroup

	mu sync.Mutex
	// targets and images are the count and the catalog entry per pooled
	// image name, names their sorted keys, spec the shape (without ID and
	// Image); a reload changes them (resize).
	targets map[string]int
	images  map[string]contract.CatalogImage
	names   []string
	spec    sandboxkit.BootSpec
	ready   map[string][]*Boot
	// kick wakes the filler after a claim.
	kick chan struct{}
	done chan struct{}
}

func NewWarmPool(h Host, targets map[string]int, kit *sandboxkit.Config, catalog []contract.CatalogImage) *WarmPool {
	w := &WarmPool{
		h:     h,
		ready: map[string][]*Boot{},
		kick:  make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
	w.discard = func(b *Boot) { _ = w.h.StopBooted(context.Background(), b) }
	w.targets, w.images, w.names, w.spec = poolPlan(targets, kit, catalog)
	return w
}

// poolPlan is what the pool keeps: the targets, each pooled image's
// catalog entry, the sorted names, and the default shape.
func poolPlan(targets map[string]int, kit *sandboxkit.Config, catalog []contract.CatalogImage) (map[string]int, map[string]contract.CatalogImage, []string, sandboxkit.BootSpec) {
	images := map[string]contract.CatalogImage{}
	var names []string
	for name := range targets {
		names = append(names, name)
		for _, c := range catalog {
			if c.Name == name {
				images[name] = c
			}
		}
	}
	sort.Strings(names)
	spec := sandboxkit.BootSpec{AutoInstall: kit.AutoInstall, CPUs: kit.DefaultCPUs, MemoryMB: kit.DefaultMemoryMB, ReaperTick: kit.ReaperTick}
	return targets, images, names, spec
}

// sameShape reports whether VMs booted for a are what b would boot.
func sameShape(a, b sandboxkit.BootSpec) bool {
	return a.AutoInstall == b.AutoInstall && a.CPUs == b.CPUs && a.MemoryMB == b.MemoryMB && a.ReaperTick == b.ReaperTick
}

// Resize applies a reloaded warm_pool (and the kit's defaults and
// catalog): ready VMs beyond an image's new target, and every ready VM
// whose shape or image reference no longer matches, are stopped; the
// filler boots what is now missing. A boot under way is checked against
// the new plan when it ends (run).
func (w *WarmPool) Resize(targets map[string]int, kit *sandboxkit.Config, catalog []contract.CatalogImage) {
	nt, ni, nn, ns := poolPlan(targets, kit, catalog)
	var drop []*Boot
	w.mu.Lock()
	reshaped := !sameShape(w.spec, ns)
	for name, list := range w.ready {
		keep := min(nt[name], len(list))
		if reshaped || ni[name].OCIRef != w.images[name].OCIRef {
			keep = 0
		}
		drop = append(drop, list[keep:]...)
		if keep == 0 {
			delete(w.ready, name)
		} else {
			w.ready[name] = list[:keep:keep]
		}
	}
	w.targets, w.images, w.names, w.spec = nt, ni, nn, ns
	w.discards.Add(len(drop))
	w.mu.Unlock()
	for _, b := range drop {
		go func() {
			defer w.discards.Done()
			w.discard(b)
		}()
	}
	w.wake()
}

// wanted reports whether a VM just booted from spec still fits the plan
// (a reload may have changed it meanwhile); the caller holds w.mu.
func (w *WarmPool) wantedLocked(name string, spec sandboxkit.BootSpec) bool {
	return len(w.ready[name]) < w.targets[name] && sameShape(spec, w.spec) && spec.Image.OCIRef == w.images[name].OCIRef
}

// matches reports whether a create of spec may be served from the pool:
// the same image in the default shape. Env, the name and the idle timeout
// are applied at claim (they live on the host side).
func (w *WarmPool) matches(spec sandboxkit.BootSpec) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.targets[spec.Image.Name]
	return ok && !spec.Network && spec.CPUs == w.spec.CPUs && spec.MemoryMB == w.spec.MemoryMB &&
		spec.Image.OCIRef == w.images[spec.Image.Name].OCIRef
}

// ClaimFor is claim on a nil pool too (no warm_pool): it returns a Boot
// the request's spec is applied to, marked Pooled, or nil.
func (w *WarmPool) ClaimFor(ctx context.Context, spec sandboxkit.BootSpec) *Boot {
	if w == nil {
		return nil
	}
	b := w.claim(spec)
	if b == nil {
		return nil
	}
	poolID := b.Spec.ID
	reseeded, err := Freshen(ctx, b, SandboxHostname(spec.ID))
	if err != nil {
		// The VM is fine but not fresh: stop it and boot cold.
		w.h.Log().Warn("reseeding a pooled VM failed; booting cold instead", "pool_id", poolID, "error", err.Error())
		go func() { _ = w.h.StopBooted(context.Background(), b) }()
		return nil
	}
	b.Spec = spec
	b.Pooled = poolID
	// The pool's boot took its time earlier; this create took none of it.
	b.Timings = nil
	// What configure-guest set from the pool's spec, again from the
	// request's: the exec environment.
	b.Env = MergeEnv([]string{"HOME=/root"}, b.Image.Config.Env, spec.Env)
	w.h.Log().Info("warm pool VM claimed", "sandbox_id", spec.ID, "pool_id", poolID, "image", spec.Image.Name, "reseeded", reseeded)
	return b
}

// claim takes one ready VM of spec's image, or nil. A VM is in one list
// and removed under the lock, so it is never handed out twice. VMs whose
// runner died while waiting are cleaned up and skipped.
func (w *WarmPool) claim(spec sandboxkit.BootSpec) *Boot {
	if !w.matches(spec) {
		return nil
	}
	defer w.wake()
	for {
		w.mu.Lock()
		list := w.ready[spec.Image.Name]
		if len(list) == 0 {
			w.mu.Unlock()
			return nil
		}
		b := list[0]
		w.ready[spec.Image.Name] = list[1:]
		w.mu.Unlock()
		select {
		case <-b.Runner.Done():
			w.h.Log().Warn("a pooled VM died while waiting; dropping it", "pool_id", b.Spec.ID)
			go func() { _ = w.h.StopBooted(context.Background(), b) }()
			continue
		default:
		}
		return b
	}
}

func (w *WarmPool) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Info is adapter::info's warm_pool: {image: {ready, target}}.
func (w *WarmPool) Info() map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]any{}
	for _, n := range w.names {
		out[n] = map[string]any{"ready": len(w.ready[n]), "target": w.targets[n]}
	}
	return out
}

// next is the image most short of its target, or "".
func (w *WarmPool) next() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	best, short := "", 0
	for _, n := range w.names {
		if d := w.targets[n] - len(w.ready[n]); d > short {
			best, short = n, d
		}
	}
	return best
}

// Run fills the pool until ctx ends, one boot at a time.
func (w *WarmPool) Run(ctx context.Context) {
	defer close(w.done)
	for ctx.Err() == nil {
		name := w.next()
		if name == "" {
			select {
			case <-w.kick:
			case <-ctx.Done():
			}
			continue
		}
		w.mu.Lock()
		spec := w.spec
		spec.Image = w.images[name]
		w.mu.Unlock()
		spec.ID = uuid.New().String()
		b := &Boot{Host: w.h, Spec: spec}
		t0 := time.Now()
		if err := w.h.Steps().Run(ctx, b); err != nil {
			if ctx.Err() != nil {
				return
			}
			if b.restore != nil {
				w.h.Templates().restoreFailed(b.tplKey, err)
			}
			w.h.Log().Warn("warm pool boot failed; retrying later", "image", name, "error", err.Error())
			t := time.NewTimer(poolRetryDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			continue
		}
		afterBoot(b, time.Since(t0))
		w.h.Log().Info("warm pool VM ready", "image", name, "pool_id", spec.ID, "ms", time.Since(t0).Milliseconds(), "restored", b.restore != nil)
		w.mu.Lock()
		if !w.wantedLocked(name, spec) {
			// A reload shrank or reshaped the pool during the boot.
			w.discards.Add(1)
			w.mu.Unlock()
			w.h.Log().Info("warm pool VM no longer wanted after a reload; stopping it", "image", name, "pool_id", spec.ID)
			w.discard(b)
			w.discards.Done()
			continue
		}
		w.ready[name] = append(w.ready[name], b)
		w.mu.Unlock()
	}
}

// Shutdown waits for the filler (its context is the provider's, already
// canceled: a boot under way is rolled back) and stops every ready VM.
func (w *WarmPool) Shutdown(ctx context.Context) error {
	select {
	case <-w.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	w.mu.Lock()
	var left []*Boot
	for n, list := range w.ready {
		left = append(left, list...)
		delete(w.ready, n)
	}
	w.mu.Unlock()
	w.discards.Wait()
	errs := make(chan error, len(left))
	for _, b := range left {
		go func() { errs <- w.h.StopBooted(ctx, b) }()
	}
	var first error
	for range left {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
