// Package exepages lets a long-running process give back the pages of its
// own executable that only its start-up used.
//
// A Go binary's code and read-only data are mapped from the file. Package
// initialisers, flag and configuration parsing and schema compilation touch
// pages all over both mappings once, and the kernel maps up to 64 KiB around
// each fault, so an idle engine kept about 18 MiB of its 42 MB binary
// resident of which it touches about 4 MiB again while idle (BENCHMARKS.md,
// P7). Dropping the page-table entries once start-up is over leaves the
// pages in the page cache, where a later use maps them back at the cost of
// a minor fault; the resident set then shows what the process uses.
package exepages

// Region is one read-only, private, file-backed mapping of the executable.
type Region struct {
	Start, End uint64
	// Resident is the mapping's resident size in bytes.
	Resident int64
	// Private is the size of its copied-on-write pages (smaps'
	// Anonymous): they exist only in this process and must never be
	// dropped.
	Private int64
}
