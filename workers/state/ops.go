package state

import (
	"encoding/json"

	"github.com/iii-sandbox/iii/internal/updateops"
)

// The operations of state::update are internal/updateops', the one
// implementation the engine's stream::update shares (as upstream's state
// and stream workers share iii_helpers::stream); it does not link the
// engine.
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
