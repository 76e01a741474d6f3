package engine

import (
	"context"
	"encoding/json"

	"github.com/iii-sandbox/iii/internal/procstats"
	"github.com/iii-sandbox/iii/protocol"
)

// FnRuntimeStats reports the engine process's own goroutines, open file
// descriptors and resident memory, in the shape of the "runtime" block
// every SDK-served adapter adds to adapter::info, so a long run can watch
// both for leaks. Privileged: it describes the host process, which only
// its operator needs to see.
const FnRuntimeStats = "engine::runtime::stats"

var schemaRuntimeStatsIn = json.RawMessage(`{"type":"object","properties":{}}`)

var schemaRuntimeStatsOut = json.RawMessage(`{"type":"object","required":["goroutines","open_fds","rss_bytes"],"properties":{` +
	`"goroutines":{"type":"integer","minimum":0,"description":"The engine process's goroutines."},` +
	`"open_fds":{"type":"integer","minimum":-1,"description":"Its open file descriptors; -1 where the system does not show them."},` +
	`"rss_bytes":{"type":"integer","minimum":-1,"description":"Its resident memory in bytes (VmRSS on Linux; elsewhere what the Go runtime holds, an estimate); -1 when unknown."}}}`)

func (e *Engine) fnRuntimeStats(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct{}
	if eb := decodeInput(call.Data, &in); eb != nil {
		return nil, eb
	}
	return procstats.Read(), nil
}
