package backend

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/usernet"
)

// netWait bounds how long a back end waits for its VM's network to end after
// the VM did (it ends as soon as it reads EOF).
const netWait = 10 * time.Second

// ServeNetwork runs the VM's user-mode network on host, the runner's end of
// the NIC's stream, which it takes over. The network ends when the VM
// closes its end or ctx ends; wait waits for that (bounded by netWait).
// Every flow the guest opens is dialled by this process, after usernet's
// policy allowed it: never the host's loopback or its own addresses.
func ServeNetwork(ctx context.Context, host *os.File, spec Spec, log hclog.Logger) (wait func(), err error) {
	cfg, err := spec.NetConfig()
	if err != nil {
		_ = host.Close()
		return nil, err
	}
	cfg.Log = log.Named("usernet")
	n, err := usernet.New(cfg)
	if err != nil {
		_ = host.Close()
		return nil, fmt.Errorf("the VM's network: %w", err)
	}
	conn, err := net.FileConn(host)
	_ = host.Close() // FileConn holds its own descriptor
	if err != nil {
		return nil, fmt.Errorf("the VM's network: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.Serve(ctx, conn); err != nil {
			log.Warn("the VM's network ended with an error", "error", err)
		}
	}()
	log.Debug("network up", "allow_cidrs", spec.NetAllowCIDRs, "forwards", len(spec.NetForwards))
	return func() {
		select {
		case <-done:
		case <-time.After(netWait):
			_ = conn.Close()
			<-done
		}
	}, nil
}
