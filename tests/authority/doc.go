// Package authority is the acceptance test of "authority when a call
// runs" (docs/security.md): the real `iii` binary runs an engine from a
// config.yaml with iii-stream, and workers written with the published
// Node SDK (iii-sdk) try the confused deputy through every kind of call
// the engine makes on someone's behalf — a stream trigger, a trigger's
// condition function, a configuration trigger, an enqueued call and a
// trigger type served by a worker holding the engine token. The
// privileged function never runs for them; the controls that go the same
// way do.
//
// It has no code of its own. It uses $III_BIN_DIR/iii when set (`make
// test` sets it to bin/), else it builds iii; without node or the SDK
// (make setup-test) its tests skip and say why.
package authority
