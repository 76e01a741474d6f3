package engine

import (
	"encoding/json"

	"github.com/iii-sandbox/iii/protocol"
)

// The call path (invokefunction in, invocationresult back) is most of an
// engine's traffic. Decoding those frames with encoding/json into the
// protocol's 30-field union costs more than the rest of routing together,
// and large payloads are scanned twice and copied. The fast path reads the
// frame with protocol.ScanCallFrame: only the top level, the whole frame
// validated, the payloads kept as spans of the frame. Anything unusual
// (escaped or non-ASCII keys, escaped ids, fields of unexpected JSON types,
// invalid JSON) falls back to protocol.Decode, so behaviour — including
// every error answer — is defined in one place.

// fastPath handles invokefunction and invocationresult frames; handled
// false means the frame goes through protocol.Decode. handedOff is
// routeInvoke's.
func (e *Engine) fastPath(w *worker, data []byte, inPlace inPlaceRunner) (handled, handedOff bool) {
	var f protocol.CallFrame
	if !protocol.ScanCallFrame(data, &f) {
		return false, false
	}
	switch f.Type {
	case protocol.TypeInvokeFunction:
		r := &invokeRequest{
			invocationID: f.InvocationID, functionID: f.FunctionID, data: nonNullRaw(f.Data),
			metadata: nonNullRaw(f.Metadata), traceparent: f.Traceparent, baggage: f.Baggage, namespace: f.Namespace,
		}
		if a := nonNullRaw(f.Action); a != nil {
			var act protocol.TriggerAction
			if json.Unmarshal(a, &act) != nil {
				return false, false
			}
			r.action = &act
		}
		r.inPlace = inPlace
		return true, e.routeInvoke(w, r)
	case protocol.TypeInvocationResult:
		var errb *protocol.ErrorBody
		if er := nonNullRaw(f.Error); er != nil {
			errb = new(protocol.ErrorBody)
			if json.Unmarshal(er, errb) != nil {
				return false, false
			}
		}
		e.handleResult(w, f.InvocationID, f.Result, errb, f.Traceparent, f.Baggage)
		return true, false
	}
	return false, false
}

func nonNullRaw(b []byte) []byte {
	if len(b) == 0 || (len(b) == 4 && string(b) == "null") {
		return nil
	}
	return b
}
