// Package e2e holds sandbox-libkrun's acceptance tests: the adapter binary
// as a real go-plugin subprocess, booting real VMs (QEMU under TCG on the
// build machines) from the Debian-built python image. It has no code of
// its own; run it with `go test ./plugins/sandbox-libkrun/e2e/`.
package e2e
