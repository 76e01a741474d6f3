// Package pluginhost runs sandbox adapters as go-plugin subprocesses and
// publishes each in the engine as an ordinary worker: <adapter> in its
// namespace, runtime go-plugin, with the functions <adapter>::<op> for the
// sixteen operations of the sandbox contract and <adapter>::adapter::info
// (DESIGN decisions 2 and 3; docs/adapters.md).
//
// A Host finds an adapter binary by name (Finder), starts it in its own
// process group with a lifeline pipe, speaks go-plugin over gRPC with
// AutoMTLS and the contract's versioned plugin set, refuses another
// contract major (S302), hands the adapter its configuration (a rejected
// one is final: the adapter exits and callers get S301 with its reason),
// and serves calls: JSON decoded with contract.Decode*, the adapter called
// over gRPC, the reply encoded, fs::write and fs::read streamed through
// engine channels. It pings each adapter, relaunches one that dies (calls
// in flight fail at once with S301) and kills the whole process group when
// it stops one, so no adapter process outlives Close.
//
// The host's own functions, engine::adapters::start, stop, restart and
// list, live in the default namespace under the internal worker
// iii-plugin-host.
package pluginhost
