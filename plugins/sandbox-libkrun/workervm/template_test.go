package workervm

import (
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
)

// TestWorkerBootSkipsTemplates: a worker VM's boot never resumes from (or
// records) a snapshot template (issue 23: its data disk is its own);
// boot's TestNoTemplateBootSkipsTemplates shows what NoTemplate does.
func TestWorkerBootSkipsTemplates(t *testing.T) {
	var h boot.Host // newBoot only hands it on
	pl := &workerPlan{
		req:   &contract.WorkerStartRequest{Name: "w"},
		image: contract.CatalogImage{Name: "python"}, cpus: 1, memoryMB: 512, hostname: "w",
	}
	w := &workerVM{id: "0b7c3a52-4c0e-4b6a-9a43-5bd0c6d8a001"}
	b := w.newBoot(h, pl, false)
	assert.Check(t, b.NoTemplate, "the worker VM's boot may use a snapshot template")
	assert.Equal(t, b.Spec.ID, w.id)
}
