// Package adapter is the sandbox-libkrun adapter: a sandboxkit.Provider
// that boots every sandbox as a microVM, and New, which puts the kit's
// Manager over it and serves worker::* too.
//
// The Provider holds the adapter's state and wires its parts together:
// package boot chooses the back end once per process and boots each VM
// through a pipeline of named steps (the Provider is its boot.Host);
// package workervm runs the worker VMs; package config reads the keys. A
// sandbox is then a thin layer over the agent connection (package
// agentclient), which pauses, resumes and outlives the adapter process
// (adopt.go); the contract's rules stay in sandboxkit.
// docs/sandbox-libkrun.md describes configuration, the state directory and
// the clean-up guarantees.
package adapter
