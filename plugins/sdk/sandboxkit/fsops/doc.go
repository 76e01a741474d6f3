// Package fsops implements the sandbox contract's ten filesystem
// operations (ls, stat, mkdir, write, read, rm, chmod, mv, grep, sed) on a
// directory tree opened as an *os.Root, with the contract's semantics and
// S-codes. Any adapter whose files are reachable as a local directory can
// serve them with it, as the hostdir example adapter does. Because os.Root
// confines every call to its directory, neither ".." nor a symbolic link
// can reach outside (S215).
//
// The operations themselves live in the module's internal sandboxfs
// package, which the libkrun guest agent runs too (over plain paths inside
// its VM); this package maps them onto the contract's requests, replies
// and S-codes, so both adapters answer alike.
//
// The package is plain Go with no goroutines of its own and no dependency
// on go-plugin.
package fsops
