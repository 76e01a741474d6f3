// Package fsops implements the sandbox contract's ten filesystem
// operations (ls, stat, mkdir, write, read, rm, chmod, mv, grep, sed) on a
// directory tree opened as an *os.Root, with the contract's semantics and
// S-codes. Any adapter whose files are reachable as a local directory can
// serve them with it: the hostdir example adapter on the host, a guest
// agent inside a VM on "/". Because os.Root confines every call to its
// directory, neither ".." nor a symbolic link can reach outside (S215).
//
// The package is plain Go with no goroutines of its own and no dependency
// on go-plugin, so a guest agent can import it.
package fsops
