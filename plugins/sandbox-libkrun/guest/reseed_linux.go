package guest

import (
	"context"
	"encoding/binary"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Reseed serves reseed. The seed (random bytes from the host's CSPRNG) is
// credited to the kernel's input pool and the CRNG is reseeded from it at
// once: writing to /dev/urandom alone only mixes the bytes in, and the CRNG
// would keep producing what it produces in every other VM restored from
// the same snapshot template until its next scheduled reseed. Where the
// ioctls are refused the seed is still mixed in. The clock is set to the
// host's time and the host name to the sandbox's when the request carries
// them.
func Reseed(_ context.Context, req *agentproto.ReseedRequest) (*agentproto.ReseedResult, error) {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return nil, agentproto.Errorf(agentproto.CodeInternal, "open /dev/urandom: %v", err)
	}
	defer f.Close()
	res := &agentproto.ReseedResult{SeedBytes: len(req.Seed)}
	if creditEntropy(f, req.Seed) == nil {
		res.Reseeded = unix.IoctlSetInt(int(f.Fd()), unix.RNDRESEEDCRNG, 0) == nil
	} else if _, err := f.Write(req.Seed); err != nil {
		return nil, agentproto.Errorf(agentproto.CodeInternal, "write the seed to /dev/urandom: %v", err)
	}
	if req.UnixNano > 0 {
		ts := unix.NsecToTimespec(req.UnixNano)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return nil, agentproto.Errorf(agentproto.CodeInternal, "set the clock: %v", err)
		}
		res.ClockSet = true
	}
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			return nil, agentproto.Errorf(agentproto.CodeInternal, "set the host name: %v", err)
		}
		res.HostnameSet = true
	}
	return res, nil
}

// creditEntropy is RNDADDENTROPY: struct rand_pool_info {int
// entropy_count; int buf_size; __u32 buf[];}, crediting every bit.
func creditEntropy(f *os.File, seed []byte) error {
	info := make([]byte, 8+len(seed)+3) // buf is __u32-sized
	binary.NativeEndian.PutUint32(info[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(seed)))
	copy(info[8:], seed)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0])))
	if errno != 0 {
		return errno
	}
	return nil
}
