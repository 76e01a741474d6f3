package boot

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// TestNoTemplateBootSkipsTemplates is issue 23's worker::start failure ("a VM
// with a data disk has no template"): with a snapshot template of the
// worker's image and shape on disk, find-template picked it for the
// worker VM, whose data disk is only set by the later prepare-state-dir
// step, and the runner's spec then refused the pair. A worker VM's boot
// (NoTemplate, as the worker VMs set it) neither
// restores from a template nor records one; a sandbox of the same image
// and shape still restores (so the fixture does hold a usable template).
func TestNoTemplateBootSkipsTemplates(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, []byte(name), 0o600))
		return p
	}
	h := &testHost{}
	h.templates = &Templates{h: h, root: filepath.Join(dir, "templates"), enabled: true, maxBytes: 1 << 30, recording: map[string]bool{}, failed: map[string]time.Time{}}
	sel := &Selection{Backend: backend.QEMU, Accel: backend.AccelTCG, QEMUBinary: file("qemu"), Kernel: qemu.Kernel{Path: file("vmlinux")}}
	img := &images.Image{Digest: "sha256:aa", RootfsPath: file("rootfs.erofs")}
	initrd := file("initrd")
	image := contract.CatalogImage{Name: "python"}
	sandboxBoot := &Boot{Host: h, Spec: sandboxkit.BootSpec{ID: "0b7c3a52-4c0e-4b6a-9a43-5bd0c6d8a002", Image: image, CPUs: 1, MemoryMB: 512, Network: true}}
	workerBoot := &Boot{Host: h, Spec: sandboxkit.BootSpec{ID: "0b7c3a52-4c0e-4b6a-9a43-5bd0c6d8a001", Image: image, CPUs: 1, MemoryMB: 512, Network: true}, Hostname: "w", NoTemplate: true}
	for _, b := range []*Boot{sandboxBoot, workerBoot} {
		b.Selection, b.Image, b.Initrd = sel, img, initrd
	}
	// Record a template for the sandbox's key, as a finished recording
	// leaves it.
	k, ok := h.templates.keyFor(sandboxBoot)
	assert.Assert(t, ok)
	tdir := h.templates.dir(k)
	assert.NilError(t, os.MkdirAll(tdir, 0o700))
	assert.NilError(t, os.WriteFile(filepath.Join(tdir, templateMemName), []byte("m"), 0o600))
	assert.NilError(t, os.WriteFile(filepath.Join(tdir, templateStateName), []byte("s"), 0o600))

	assert.NilError(t, stepFindTemplate(context.Background(), sandboxBoot))
	assert.Check(t, sandboxBoot.restore != nil, "the sandbox of the same image and shape did not find the template")

	assert.NilError(t, stepFindTemplate(context.Background(), workerBoot))
	assert.Check(t, workerBoot.restore == nil, "the worker VM picked a snapshot template")
	assert.Check(t, !workerBoot.tplMiss, "the worker VM's boot would record a template")
}
