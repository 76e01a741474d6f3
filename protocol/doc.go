// Package protocol holds the iii worker wire protocol: the JSON frames that
// workers and the engine exchange over a WebSocket, one object per text
// frame, tagged by a lowercase "type" (spec/engine-internals.md §1.3).
//
// The engine (host/engine) and the Go client (client) both speak through this
// package, so a frame has exactly one Go shape. Payloads that the engine only
// relays (invocation data, results, schemas) stay json.RawMessage: the engine
// never decodes what it does not need to route.
package protocol
