package engine

import "strings"

// The 0.25/0.26 SDKs add observers (observe, call through an observer)
// and negotiate them through the features list of the engine's
// workerregistered greeting (observe.capture). This engine speaks the
// trigger generation of the protocol, the one the published iii-sdk
// 0.22.1 speaks, and its greeting lists no features, as an engine
// without observers does: upstream documents that an SDK then fails
// observe with UNSUPPORTED and runs no hooks (docs/upgrading-to-0.26.md).
// The frames an SDK would send for observers are not published, so the
// engine does not guess at them: a frame type it does not speak is
// logged once per connection, with the way out, and the connection
// stays up (its calls and registrations go on working).

// CodeUnsupported is upstream's code for a feature this engine does not
// have (an observe sent to an engine without observers).
const CodeUnsupported = "UNSUPPORTED"

// unknownFrame tells the log, once per connection, that w sent a frame
// type this engine does not speak.
func (e *Engine) unknownFrame(w *worker, frameType string) {
	if len(frameType) > 64 {
		frameType = frameType[:64] + "…"
	}
	if !w.warnedUnknownFrame.CompareAndSwap(false, true) {
		e.log.Debug("ignoring a frame of a type this engine does not speak", "worker_id", w.id, "type", frameType)
		return
	}
	if strings.Contains(strings.ToLower(frameType), "observ") {
		e.log.Warn("a worker sent an observer frame: observers (iii 0.25+) are not supported by this engine, which lists no protocol features; use registerTrigger (trigger types cron, http, durable:subscriber, state) as iii-sdk 0.22 does (docs/upgrading-to-0.26.md)",
			"code", CodeUnsupported, "worker_id", w.id, "type", frameType)
		return
	}
	e.log.Warn("a worker sent a frame of a type this engine does not speak; ignored (its other frames are served)",
		"code", CodeUnsupported, "worker_id", w.id, "type", frameType)
}
