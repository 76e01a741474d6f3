package config

import (
	"os"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// Every key the adapter takes has its row in docs/sandbox-libkrun.md's
// configuration table, so an operator can look up what a key does.
func TestConfigKeysDocumented(t *testing.T) {
	b, err := os.ReadFile("../../../docs/sandbox-libkrun.md")
	assert.NilError(t, err)
	doc := string(b)
	for _, k := range ConfigKeys() {
		assert.Check(t, strings.Contains(doc, "\n| `"+k+"` |"), "docs/sandbox-libkrun.md has no row for %q", k)
	}
}
