package guest

import (
	"context"
	"os"

	"golang.org/x/sys/unix"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Reseed serves reseed: the seed is written to /dev/urandom, which mixes
// it into the kernel's input pool (without crediting entropy: the kernel
// seeded itself at boot; this makes a VM booted ahead of its use diverge
// from every other one booted from the same image), and the clock is set
// to the host's time when the request carries it.
func Reseed(_ context.Context, req *agentproto.ReseedRequest) (*agentproto.ReseedResult, error) {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return nil, agentproto.Errorf(agentproto.CodeInternal, "open /dev/urandom: %v", err)
	}
	n, err := f.Write(req.Seed)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, agentproto.Errorf(agentproto.CodeInternal, "write the seed to /dev/urandom: %v", err)
	}
	res := &agentproto.ReseedResult{SeedBytes: n}
	if req.UnixNano > 0 {
		ts := unix.NsecToTimespec(req.UnixNano)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return nil, agentproto.Errorf(agentproto.CodeInternal, "set the clock: %v", err)
		}
		res.ClockSet = true
	}
	return res, nil
}
