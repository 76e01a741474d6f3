// Package contract is the single source of truth for the iii sandbox
// contract 1.1: the Go request and response types of the sixteen
// sandbox::<op> functions and adapter::info (and of the six
// <adapter>::worker::* functions of adapters that run Compose's worker
// VMs, worker.go), the shared decoding and
// validation of their JSON payloads, the table of S-codes and the error wire
// object, the Adapter interface an adapter implements, and the gRPC glue
// (proto in contract/proto, client, server, go-plugin plugin) that carries
// the contract between the engine's plugin host and an adapter subprocess.
//
// The layout follows the go-plugin practice of keeping the interface and
// plain structs in one package with the wire code beside them: hosts and
// adapters import this package, never the generated code directly.
//
// JSON is the contract users see (docs/sandbox-contract.md); the gRPC
// service is an internal transport between the engine and its adapter
// subprocesses and may only grow additively within a contract major.
package contract
