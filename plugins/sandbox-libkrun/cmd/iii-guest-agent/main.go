//go:build linux

// Command iii-guest-agent is /init inside a sandbox VM: it mounts the API
// filesystems, loads the kernel modules the initramfs lists, switches into
// the sandbox root (the image read-only under a tmpfs upper layer), reaps
// orphans as PID 1, and serves exec and filesystem requests from the host
// on the virtio-console port "iii.exec". docs/guest-agent.md describes it.
//
// Build it static: CGO_ENABLED=0 GOOS=linux GOARCH=amd64|arm64.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/internal/version"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/guest"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "--version" || os.Args[1] == "version") {
		fmt.Printf("iii-guest-agent %s (protocol %d.%d, %s/%s)\n", version.Version,
			agentproto.ProtocolMajor, agentproto.ProtocolMinor, runtime.GOOS, runtime.GOARCH)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "iii-guest-agent: this program is the init (PID 1) of a sandbox VM's initramfs and does nothing elsewhere; see docs/guest-agent.md")
		os.Exit(2)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "iii-guest-agent", Output: os.Stderr, Level: hclog.Info})
	if err := run(log); err != nil {
		// PID 1 must not exit (the kernel would panic with a less useful
		// message); report and power off, so the host sees the VM exit
		// with this line at the end of its console log.
		log.Error("agent failed; powering off", "error", err)
		time.Sleep(100 * time.Millisecond)
		_ = guest.PowerOff()
		select {}
	}
}

func run(log hclog.Logger) error {
	ctx := context.Background()
	// The reaper runs from the start: every process the agent starts
	// reports through it, and orphans must never pile up as zombies.
	reaper := guest.NewReaper()
	go reaper.Run(ctx)

	info, err := guest.Boot(log)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	port, err := guest.OpenPort(info.PortPath)
	if err != nil {
		return err
	}
	defer port.Close()
	exec := &guest.Executor{Waiter: reaper}
	srv := &guest.Server{
		Port: port,
		// The agent's built-ins (freezing a worker's disk for its copy)
		// travel as execs; everything else runs in the guest's root.
		Exec:      &builtinExec{next: exec, upper: &upperFreezer{spec: info.Params.Upper, log: log}},
		FS:        &guest.FS{Root: "/"},
		Procs:     &guest.Supervisor{Exec: exec},
		Workspace: guest.Workspace{},
		Net:       &guest.Network{Root: "/"},
		NetStats:  &guest.NetCounters{Proc: "/proc", Sys: "/sys"},
		Reseed:    guest.Reseed,
		PowerOff:  guest.PowerOff,
		Hello: agentproto.Hello{
			Version: version.Version,
			Arch:    runtime.GOARCH,
			Kernel:  info.Kernel,
			Root:    info.Root,
			BootMS:  guest.Uptime().Milliseconds(),
		},
		Uptime: guest.Uptime,
		Log:    log,
	}
	log.Info("ready", "port", info.PortPath, "root", info.Root, "modules", len(info.Modules), "uptime_ms", srv.Hello.BootMS)
	return srv.Serve(ctx)
}
