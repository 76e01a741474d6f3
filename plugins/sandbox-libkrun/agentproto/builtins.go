package agentproto

import "strings"

// Programs the agent's exec serves itself: an ExecRequest whose Argv[0] is
// one of these runs inside the agent (PID 1) instead of a program of the
// guest's root. They carry operations that need the agent's own view of
// the VM, such as the worker's persistent upper layer, which the guest's
// processes cannot reach: it is mounted outside their root. The names
// hold a colon, which no program a PATH lookup finds is expected to have;
// an agent that predates them answers exit status 127 (not found), which
// the host reads as "not served".
const (
	// BuiltinPrefix starts the name of every built-in. The host never lets
	// a caller's exec name one: freezing a worker's disk is the host's own
	// operation (agentclient.Client.Exec refuses them).
	BuiltinPrefix = "iii-guest-agent:"
	// ExecFreezeUpper freezes the filesystem of the VM's persistent upper
	// layer (FIFREEZE): its writes are flushed, its journal made clean,
	// and every later write blocks until ExecThawUpper, so the host can
	// copy the disk as one consistent image. Argv[1], when present, is
	// the auto-thaw in milliseconds: the agent thaws by itself after
	// that long, so a host that went away never leaves the guest stuck.
	ExecFreezeUpper = "iii-guest-agent:freeze-upper"
	// ExecThawUpper thaws what ExecFreezeUpper froze; thawing an upper
	// layer that is not frozen succeeds.
	ExecThawUpper = "iii-guest-agent:thaw-upper"
)

// DefaultAutoThawMS is the auto-thaw of ExecFreezeUpper when Argv[1] is
// absent.
const DefaultAutoThawMS = 60_000

// IsBuiltin reports whether name is the agent's own program: one a caller's
// exec must not reach.
func IsBuiltin(name string) bool { return strings.HasPrefix(name, BuiltinPrefix) }
