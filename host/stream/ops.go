package stream

import (
	"encoding/json"

	"github.com/iii-sandbox/iii/internal/updateops"
)

// The operations of stream::update are internal/updateops', which the
// registry state worker's state::update shares.
type (
	UpdateOp = updateops.Op
	OpError  = updateops.OpError
)

// decodeOps refuses a malformed ops array with this worker's invalid-input
// code.
func decodeOps(raw json.RawMessage) ([]UpdateOp, error) {
	ops, err := updateops.Decode(raw)
	if err != nil {
		return nil, errorf(CodeInvalidInput, "%s", err)
	}
	return ops, nil
}

func decodeValue(raw json.RawMessage) (any, error) { return updateops.DecodeValue(raw) }

func applyOps(old any, exists bool, ops []UpdateOp) (any, []OpError) {
	return updateops.Apply(old, exists, ops)
}

// orNull is b, or JSON null when b is empty.
func orNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}
