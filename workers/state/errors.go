package state

import (
	"fmt"

	"github.com/iii-sandbox/iii/protocol"
)

// Error codes. Upstream's worker prefixes its codes into the message
// ("VALUE_TOO_LARGE: value of …"), since its SDK's handler errors carry no
// code; this worker sets the code too, and keeps the prefix, so a caller
// matching either finds it.
const (
	CodeValueTooLarge   = "VALUE_TOO_LARGE"
	CodeSetError        = "SET_ERROR"
	CodeGetError        = "GET_ERROR"
	CodeDeleteError     = "DELETE_ERROR"
	CodeUpdateError     = "UPDATE_ERROR"
	CodeListError       = "LIST_ERROR"
	CodeListKeysError   = "LIST_KEYS_ERROR"
	CodeListGroupsError = "LIST_GROUPS_ERROR"
	// CodeInvalidCursor, CodeRowTooLarge and CodeSnapshotCapacity are
	// state::list_entries' (upstream's codes).
	CodeInvalidCursor    = "INVALID_CURSOR"
	CodeRowTooLarge      = "ROW_TOO_LARGE"
	CodeSnapshotCapacity = "SNAPSHOT_CAPACITY"
	// CodeInvalidInput is a request upstream's serde decoding refuses (not
	// an object, a field missing or mistyped, a bad update operation).
	CodeInvalidInput = "INVALID_INPUT"
	// CodeInvalidConfig is a configuration the worker cannot run with.
	CodeInvalidConfig = "INVALID_CONFIG"
	// CodeStoreUnavailable: the store cannot be opened (a corrupt file, a
	// Redis that does not answer at start).
	CodeStoreUnavailable = "STORE_UNAVAILABLE"
)

// errorf is an error with code whose message starts with the code, as
// upstream's does.
func errorf(code, format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: code, Message: code + ": " + fmt.Sprintf(format, args...)}
}

// wrap is errorf around a store failure.
func wrap(code, what string, err error) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: code, Message: fmt.Sprintf("%s: %s: %v", code, what, err)}
}
