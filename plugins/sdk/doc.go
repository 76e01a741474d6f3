// Package sdk is what an iii sandbox adapter imports to become a plugin the
// engine can load: Serve runs the adapter as a go-plugin subprocess that
// speaks the sandbox contract (package contract) over gRPC, and the error
// helpers build the S-code errors callers see.
//
// An adapter is a contract.Adapter. Most adapters are built with
// sandboxkit, which implements the contract's rules (configuration,
// catalog, limits, run, the reaper) once, on top of a small Provider for
// the back end. sdktest is the conformance suite every adapter runs from
// its tests. docs/writing-an-adapter.md walks through writing one;
// docs/sdk.md is the reference.
//
// What Serve guarantees an adapter process:
//
//   - Run by hand, the binary says what it is and exits 1.
//   - stdout carries the go-plugin handshake line and nothing else; output
//     an adapter prints is logged on stderr instead.
//   - The adapter's logger writes hclog JSON on stderr, which the engine
//     re-emits in its own log.
//   - If the engine passes a lifeline (EnvLifelineFD) and dies, the
//     adapter shuts down and exits.
//   - A rejected configuration is logged and the process exits with
//     ExitConfigRejected right after replying.
//   - go-plugin's shutdown and SIGTERM call the adapter's Shutdown, with a
//     deadline, before the process exits.
//   - A panic while serving a call becomes an S-code error, not a crash.
package sdk
