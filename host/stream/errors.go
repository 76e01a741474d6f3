package stream

import (
	"fmt"

	"github.com/iii-sandbox/iii/protocol"
)

// Error codes of stream::* and of the worker's start (docs/stream.md). The
// *_ERROR codes are upstream's; the others are this engine's bounds.
const (
	// CodeInvalidInput: the request is not an object, a field is missing
	// or has the wrong type, an id is empty, too long or not UTF-8.
	CodeInvalidInput = "STREAM_INVALID_INPUT"
	// CodeValueTooLarge: one item's value is over Limits.ValueBytes.
	CodeValueTooLarge = "STREAM_VALUE_TOO_LARGE"
	// CodeStoreFull: the write would take the store over Limits.StoreBytes.
	CodeStoreFull = "STREAM_STORE_FULL"
	// CodeStoreCorrupt: the persisted store cannot be read back.
	CodeStoreCorrupt = "STREAM_STORE_CORRUPT"
	// CodeStoreIO: the persisted store cannot be written or read.
	CodeStoreIO = "STREAM_STORE_IO"
	// CodeCustomFailed: a custom stream::<op>(<stream>) function failed or
	// answered something that is not the op's result.
	CodeCustomFailed = "STREAM_CUSTOM_FAILED"
	// CodeBackendUnavailable: the redis backend cannot reach its Redis (at
	// start, within RedisDialTimeout) or a command to it failed.
	CodeBackendUnavailable = "STREAM_BACKEND_UNAVAILABLE"
	// CodeListenFailed: the stream socket cannot bind its host:port.
	CodeListenFailed = "LISTEN_FAILED"
)

func errorf(code, format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: code, Message: fmt.Sprintf(format, args...)}
}
