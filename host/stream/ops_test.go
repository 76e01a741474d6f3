package stream

import (
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
)

// The operations themselves are tested in internal/updateops; here, that a
// malformed ops array carries this worker's code.
func TestDecodeOpsCode(t *testing.T) {
	_, err := decodeOps(json.RawMessage(`[{"type":"explode"}]`))
	assert.ErrorContains(t, err, `unknown type "explode"`)
	assert.Equal(t, codeOf(t, err), CodeInvalidInput)
}
