// Package contract is the single source of truth for the iii sandbox
// contract 1.1: the Go request and response types of the sixteen
// sandbox::<op> functions and adapter::info (and of the six
// <adapter>::worker::* functions of adapters that run Compose's worker
// VMs, worker.go), the shared decoding and
// validation of their JSON payloads, the table of S-codes and the error wire
// object, the Adapter interface an adapter implements, and the go-plugin
// handshake.
//
// JSON is the contract, and the only wire form: the engine hands an
// adapter the caller's JSON untouched, and inside the adapter package
// adapterjson decodes and validates it once with this package's decoders
// and calls the Adapter, whichever transport carried it. Package
// adapterrpc is the go-plugin transport (one generic Invoke of
// contract/proto, plus the engine's channels served back to the adapter
// through go-plugin's broker); the SDK's WebSocket transport is the other.
// Both may only grow additively within a contract major.
package contract
