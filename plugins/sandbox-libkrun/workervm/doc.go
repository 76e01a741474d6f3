// Package workervm is sandbox-libkrun's worker VMs: the VMs Compose runs
// its VM workers in (worker::*). Each is booted through the sandboxes'
// pipeline (boot.DefaultBootSteps), with its state directory under
// <state_dir>/workers/<vm_id>/ instead of a throw-away one, a persistent
// ext4 disk as the guest's upper layer, and four more steps: copy the host
// directory into /workspace, publish the config file, run the install
// command when its inputs changed, start the command. The command is
// supervised by the guest agent (spawn); its output is kept on the host
// (worker.log). A Set is all of them; the adapter serves worker::* with
// one, and hands it what it boots with as a boot.Host. workervm imports
// no adapter. docs/vm-workers.md describes it for people.
package workervm
