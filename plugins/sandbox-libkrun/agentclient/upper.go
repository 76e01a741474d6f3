package agentclient

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// ErrNoFreeze is returned by FreezeUpper when the agent does not serve
// the freeze (an agent older than agentproto.ExecFreezeUpper).
var ErrNoFreeze = errors.New("the guest agent cannot freeze the upper layer (an older agent)")

// FreezeUpper freezes the filesystem of the VM's persistent upper layer,
// so the host can copy its disk as one consistent image; ThawUpper ends
// it. The agent thaws by itself after autoThaw (rounded up to a whole
// millisecond), whatever becomes of the host.
func (c *Client) FreezeUpper(ctx context.Context, autoThaw time.Duration) error {
	ms := max((autoThaw+time.Millisecond-1)/time.Millisecond, 1)
	return c.builtin(ctx, agentproto.ExecFreezeUpper, strconv.FormatInt(int64(ms), 10))
}

// ThawUpper thaws what FreezeUpper froze; it succeeds when nothing is
// frozen.
func (c *Client) ThawUpper(ctx context.Context) error {
	return c.builtin(ctx, agentproto.ExecThawUpper)
}

func (c *Client) builtin(ctx context.Context, argv ...string) error {
	res, err := c.exec(ctx, ExecRequest{Argv: argv})
	if err != nil {
		return fmt.Errorf("%s: %w", argv[0], err)
	}
	switch res.ExitCode {
	case 0:
		return nil
	case 127:
		return ErrNoFreeze
	default:
		return fmt.Errorf("%s: exit status %d: %s", argv[0], res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
}
