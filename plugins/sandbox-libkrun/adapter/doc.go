// Package adapter is the sandbox-libkrun adapter: a sandboxkit.Provider
// that boots every sandbox as a microVM, and New, which puts the kit's
// Manager over it.
//
// The Provider chooses a back end once per process (libkrun when it loads
// and boots a probe VM, else QEMU with the best accelerator that boots,
// else S300 saying what is missing), then boots each sandbox through a
// pipeline of named steps (DefaultBootSteps): resolve the image, build the
// initramfs, lock a state directory, spawn the VM's runner process, wait
// for the guest agent's hello, configure the guest. Every step undoes its
// work when a later one fails. A sandbox is then a thin layer over the
// agent connection (package agentclient); the contract's rules stay in
// sandboxkit. docs/sandbox-libkrun.md describes configuration, the state
// directory and the clean-up guarantees.
package adapter
