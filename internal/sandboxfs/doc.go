// Package sandboxfs implements the sandbox contract's ten filesystem
// operations (ls, stat, mkdir, write, read, rm, chmod, mv, grep, sed) once,
// for every adapter: the SDK's fsops serves them over an *os.Root on the
// host, the libkrun guest agent over plain paths inside the VM. Both
// answering from one implementation is what keeps their semantics and
// their messages alike.
//
// The package depends on the standard library and internal/textscan only:
// the guest agent links it and must stay free of the contract's gRPC
// dependencies. Errors are *Error values carrying a Kind; each adapter maps
// a Kind to its own code space (contract S-codes, agent-protocol codes) at
// its edge.
//
// Where the sandbox ends is the FS implementation's business, not this
// package's: an *os.Root refuses symbolic links and ".." that leave its
// directory, while Dir follows links as the kernel does (inside a VM the
// VM is the boundary).
package sandboxfs
