// Package runner is the per-VM runner process of sandbox-libkrun and the
// bookkeeping of its state directory.
//
// Every sandbox VM runs under its own runner: the adapter binary re-exec'd
// with the hidden subcommand Subcommand, in a session of its own (setsid),
// so that a crash in one VM, or a hypervisor that takes over its process
// (libkrun's krun_start_enter never returns), touches nothing else. The
// adapter side is Spawn; the runner side is Main.
//
// A runner never outlives the adapter that started it. It inherits the read
// end of a lifeline pipe whose write end only the adapter holds; when that
// end closes (the adapter stopped the sandbox, exited, or was killed with
// SIGKILL) the runner reads EOF, kills its VM and exits. QEMU itself is
// started with a parent-death signal, so it dies with its runner too.
//
// The state directory of one VM, <state_dir>/<sandbox_id>/, holds:
//
//	lock         flock'ed by the owning adapter for the VM's whole life
//	runner.json  the runner's configuration (0600; never on argv)
//	runner.pid   the runner's pid
//	vm.pid       the VM process's pid (QEMU, or the runner for libkrun)
//	exec.sock    the guest agent's port
//	runner.log   the runner's stderr
//	qemu.stderr  QEMU's stderr
//	console.log  the guest console
//
// The lock is what tells a live VM from a leftover: an adapter that dies,
// however it dies, drops its locks with its file descriptors. CleanLeftovers
// takes the lock of every directory nobody holds, kills the processes its
// pid files name after checking their command lines really are this
// directory's runner and VM, and removes it.
package runner
