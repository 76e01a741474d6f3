// Package runner is the per-VM runner process of sandbox-libkrun and the
// bookkeeping of its state directory.
//
// Every sandbox VM runs under its own runner: the adapter binary re-exec'd
// with the hidden subcommand Subcommand, in a session of its own (setsid),
// so that a crash in one VM, or a hypervisor that takes over its process
// (libkrun's krun_start_enter never returns), touches nothing else. The
// adapter side is Spawn; the runner side is Main.
//
// A runner lives as long as an adapter holds it, and for a grace after.
// It inherits the read end of a lifeline pipe whose write end only the
// adapter holds. A stop byte ('s') on it (Process.Release) makes the runner
// kill its VM and exit at once. Its end without the stop byte (Detach; the
// adapter exited, crashed, or was killed with SIGKILL) does the same when
// the runner's Config.AdoptGraceMS is 0; otherwise the runner logs "adapter
// gone; keeping the VM for <grace> for a new adapter" and waits that long
// for a new adapter to adopt it (Adopt), then kills its VM and exits. So a
// runner never outlives its last adapter by more than its grace, and QEMU,
// started with a parent-death signal, never outlives its runner. SIGTERM
// and SIGINT kill the VM at once whatever the grace.
//
// # Adoption
//
// A runner with a grace serves runner.sock (0600) in its state directory
// from its start, and holds adopt.key, 32 random bytes Spawn wrote (0600)
// before starting it; a new runner on the same directory gets a new key.
// The adapter that adopts it must hold the directory's lock (OpenDir) and
// read the key; the key never crosses the socket. The handshake is
// line-based, each line at most 256 bytes with its newline, the whole of
// it bounded by a deadline of a few seconds on both sides (any process of
// the user can connect):
//
//	runner:  III-RUNNER 1 <challenge: 32 random bytes in hex>
//	adapter: ADOPT <HMAC-SHA256(key, "iii-runner-adopt\x00" + dir + "\x00" + challenge) in hex>
//	runner:  OK <runner pid> <VM pid, 0 before the VM started>
//	     or: NO <reason>, and it hangs up
//
// dir is the state directory's clean absolute path and challenge its raw
// 32 bytes. The runner compares MACs in constant time. A wrong proof or a
// malformed line ("NO refused", "NO protocol") is logged as a warning and
// changes nothing. A right proof while another adapter holds a live
// lifeline is "NO busy" (after half a second, in case that lifeline's end
// is on its way): nobody takes over a living adapter's VM. "NO stopping":
// the VM is being killed. Another protocol version is refused by the
// adapter. After OK the connection is the lifeline, with the pipe's
// meaning: 's' kills the VM now, the end without it starts the grace
// again. The adopted runner keeps each adopter's connection open until it
// exits, so an adopted Process's Done means the runner has exited. The
// adapter checks the pid it is given against the connection's peer,
// runner.pid and the process's command line before it ever signals it.
//
// The state directory of one VM, <state_dir>/<sandbox_id>/, holds:
//
//	lock         flock'ed by the adapter that holds the VM, for as long as it does
//	runner.json  the runner's configuration (0600; never on argv)
//	runner.pid   the runner's pid
//	vm.pid       the VM process's pid (QEMU, or the runner for libkrun)
//	adopt.key    the runner's adoption key (0600; only with a grace)
//	runner.sock  the runner's adoption socket (0600; only with a grace)
//	exec.sock    the guest agent's port
//	runner.log   the runner's stderr
//	qemu.stderr  QEMU's stderr
//	console.log  the guest console
//
// The lock is what tells a live VM from a leftover: an adapter that dies,
// however it dies, drops its locks with its file descriptors. A new
// adapter first opens the directories nobody holds and adopts their
// runners (OpenDir, Adopt); CleanLeftovers then takes the lock of every
// directory nobody holds, kills the processes its pid files name after
// checking their command lines really are this directory's runner and VM,
// and removes it.
package runner
