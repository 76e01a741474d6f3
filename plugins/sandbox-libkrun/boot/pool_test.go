package boot

import (
	"context"
	"sync"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// TestWarmPoolShape: only a create of the pooled image in the default
// shape may be served from the pool; the pool reports ready and target
// per image and fills the image most short of its target first.
func TestWarmPoolShape(t *testing.T) {
	catalog := []contract.CatalogImage{{Name: "python", OCIRef: "r/python"}, {Name: "node", OCIRef: "r/node"}}
	kit := &sandboxkit.Config{DefaultCPUs: 1, DefaultMemoryMB: 512}
	w := NewWarmPool(nil, map[string]int{"python": 1, "node": 2}, kit, catalog)
	spec := sandboxkit.BootSpec{Image: catalog[0], CPUs: 1, MemoryMB: 512, Env: []string{"A=b"}, Name: "n"}
	assert.Check(t, w.matches(spec))
	for name, change := range map[string]func(*sandboxkit.BootSpec){
		"network":    func(s *sandboxkit.BootSpec) { s.Network = true },
		"cpus":       func(s *sandboxkit.BootSpec) { s.CPUs = 2 },
		"memory":     func(s *sandboxkit.BootSpec) { s.MemoryMB = 1024 },
		"other ref":  func(s *sandboxkit.BootSpec) { s.Image.OCIRef = "r/other" },
		"not pooled": func(s *sandboxkit.BootSpec) { s.Image = contract.CatalogImage{Name: "ruby", OCIRef: "r/ruby"} },
	} {
		s := spec
		change(&s)
		assert.Check(t, !w.matches(s), name)
	}
	// Nothing ready: no claim, and a nil pool claims nothing either.
	assert.Check(t, w.claim(spec) == nil)
	var none *WarmPool
	assert.Check(t, none.ClaimFor(context.Background(), spec) == nil)
	assert.DeepEqual(t, w.Info(), map[string]any{
		"node":   map[string]any{"ready": 0, "target": 2},
		"python": map[string]any{"ready": 0, "target": 1},
	})
	assert.Equal(t, w.next(), "node")
	w.ready["node"] = []*Boot{{}, {}}
	assert.Equal(t, w.next(), "python")
	w.ready["python"] = []*Boot{{}}
	assert.Equal(t, w.next(), "")
}

// TestWarmPoolResize: a reload's warm_pool stops ready VMs beyond the new
// targets, and every ready VM of a changed shape; the filler then boots
// what is missing. No VM boots: the ready lists hold placeholders.
func TestWarmPoolResize(t *testing.T) {
	catalog := []contract.CatalogImage{{Name: "python", OCIRef: "r/python"}, {Name: "node", OCIRef: "r/node"}}
	kit := &sandboxkit.Config{DefaultCPUs: 1, DefaultMemoryMB: 512}
	w := NewWarmPool(nil, map[string]int{"python": 3, "node": 1}, kit, catalog)
	var mu sync.Mutex
	var stopped []*Boot
	w.discard = func(b *Boot) {
		mu.Lock()
		stopped = append(stopped, b)
		mu.Unlock()
	}
	py := []*Boot{{}, {}, {}}
	w.ready["python"] = append([]*Boot{}, py...)
	w.ready["node"] = []*Boot{{}}

	// Fewer python, node gone: two VMs stop, one python VM stays.
	w.Resize(map[string]int{"python": 1}, kit, catalog)
	w.discards.Wait()
	assert.Equal(t, len(stopped), 3)
	assert.DeepEqual(t, w.Info(), map[string]any{"python": map[string]any{"ready": 1, "target": 1}})
	assert.Check(t, w.ready["python"][0] == py[0])
	assert.Equal(t, w.next(), "")

	// More python: the filler is woken to boot what is missing.
	w.Resize(map[string]int{"python": 2}, kit, catalog)
	assert.Equal(t, w.next(), "python")
	select {
	case <-w.kick:
	default:
		t.Fatal("the filler was not woken")
	}

	// A new default shape: every ready VM is the wrong shape.
	bigger := &sandboxkit.Config{DefaultCPUs: 2, DefaultMemoryMB: 512}
	w.Resize(map[string]int{"python": 2}, bigger, catalog)
	w.discards.Wait()
	assert.Equal(t, len(stopped), 4)
	assert.DeepEqual(t, w.Info(), map[string]any{"python": map[string]any{"ready": 0, "target": 2}})
	spec := sandboxkit.BootSpec{Image: catalog[0], CPUs: 2, MemoryMB: 512}
	assert.Check(t, w.matches(spec), "creates in the new default shape are served from the pool")
	w.mu.Lock()
	assert.Check(t, w.wantedLocked("python", spec))
	old := spec
	old.CPUs = 1
	assert.Check(t, !w.wantedLocked("python", old), "a VM booted in the old shape during the reload is not kept")
	w.mu.Unlock()
}
