// Package client is a Go client of the iii worker protocol
// (spec/engine-internals.md §1): it connects to an engine as a worker,
// registers functions (and trigger types and triggers), calls functions,
// opens streaming channels, and keeps all of that alive across reconnects.
//
// The CLI (`iii call`), Compose, the tests and the benchmarks use it; it
// speaks exactly what the published SDKs speak, so a Go worker and a Node
// worker are interchangeable from the engine's point of view.
//
// One connection at a time is live. On connect the engine greets with
// workerregistered; the client then sends reattach (when reconnecting), its
// registrations, and engine::workers::register with its metadata, and only
// then the calls that waited for a connection. Calls written on a
// connection that drops fail with CONNECTION_LOST; calls never written wait
// for the next connection (until their timeout).
package client
