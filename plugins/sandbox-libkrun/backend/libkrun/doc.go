// Package libkrun is the libkrun back end of sandbox-libkrun: it loads
// libkrun at run time with purego (no cgo, so the adapter builds and runs
// on hosts without the library) and boots one microVM per process.
//
// Two facts shape the API. First, krun_start_enter takes over the process
// and ends it with _exit when the guest stops, so Boot is meant to run in a
// per-VM runner process and never returns on success. Second, libkrun's C
// API grows by adding symbols (and build options remove some), so every
// symbol is bound on its own: an old or trimmed library still loads, Facts
// says what it lacks, and Boot fails with a clear error naming the missing
// symbol and the release that added it instead of crashing.
//
// The guest sees what the QEMU back end gives it: our kernel, our initramfs
// whose /init is the guest agent, a virtio-console port named iii.exec
// (here a socketpair whose host end Boot hands to the runner), the image as
// the first, read-only block device, and either no network device at all
// or one virtio-net NIC whose frames the runner's user-mode network serves
// (package usernet), as it does for QEMU.
//
// docs/libkrun.md describes requirements, library search, kernel formats,
// networking and macOS signing for people.
package libkrun
