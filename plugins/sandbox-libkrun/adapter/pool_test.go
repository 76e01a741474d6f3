package adapter

import (
	"context"
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
	w := newWarmPool(nil, map[string]int{"python": 1, "node": 2}, kit, catalog)
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
	var none *warmPool
	assert.Check(t, none.claimFor(context.Background(), spec) == nil)
	assert.DeepEqual(t, w.info(), map[string]any{
		"node":   map[string]any{"ready": 0, "target": 2},
		"python": map[string]any{"ready": 0, "target": 1},
	})
	assert.Equal(t, w.next(), "node")
	w.ready["node"] = []*Boot{{}, {}}
	assert.Equal(t, w.next(), "python")
	w.ready["python"] = []*Boot{{}}
	assert.Equal(t, w.next(), "")
}
