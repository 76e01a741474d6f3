package pubsub

import (
	"os"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestMakefileVersion(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "PUBSUB_VERSION ?= "+Version+"\n"))
	assert.Check(t, is.Contains(string(b), "PUBSUB_DEFAULTS := "+DefaultConfig+"\n"))
}
