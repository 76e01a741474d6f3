// Package proc runs Compose's host processes: workers and hooks in their own
// process groups with an environment built by the caller (nothing is
// inherited), stops them politely then by force, recognises a recorded pid
// as the same process through its birth identity, captures their output
// into rotating logs, and runs the reaper that kills them when Compose dies
// without stopping them.
//
// Everything here is Unix: Compose needs process groups and signals.
package proc
