// Package e2e holds the end-to-end tests of the sandbox stack: a real
// engine (host/server) over real WebSockets, the real sandbox-libkrun plugin
// subprocess booting real QEMU VMs, images pulled through a real OCI
// registry protocol (an in-process registry seeded from the Debian-built
// presets), callers written with the Go client and the published Node SDK,
// and `iii compose --up` running the adapter from a package registry.
//
// It has no code of its own. Run it with `go test ./tests/e2e/`; it builds
// iii, sandbox-libkrun and the guest agent, or uses $III_BIN_DIR (which
// `make test` sets to bin/). Under -short, or without QEMU, a guest kernel,
// mkfs.erofs or the preset images (scripts/setup.sh), its tests skip and say
// why.
package e2e
