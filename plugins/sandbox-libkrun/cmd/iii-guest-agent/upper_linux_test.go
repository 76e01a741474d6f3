package main

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/guest"
)

type recordingRunner struct{ got [][]string }

func (r *recordingRunner) Run(_ context.Context, req *agentproto.ExecRequest, _ guest.ExecIO) (*agentproto.ExitStatus, error) {
	r.got = append(r.got, req.Argv)
	return &agentproto.ExitStatus{ExitCode: 7}, nil
}

// TestBuiltinExec: the built-in names are served by the agent, with their
// arguments checked, and every other program goes to the guest's exec. A
// VM without a disk upper layer (a sandbox) has nothing to freeze; a thaw
// with nothing frozen succeeds.
func TestBuiltinExec(t *testing.T) {
	tests := []struct {
		name     string
		argv     []string
		wantCode string // the agent error's code; "" for a status
		wantExit int
		wantNext bool
	}{
		{name: "a program", argv: []string{"/bin/true"}, wantExit: 7, wantNext: true},
		{name: "a built-in's name as an argument", argv: []string{"echo", agentproto.ExecFreezeUpper}, wantExit: 7, wantNext: true},
		{name: "freeze, tmpfs upper", argv: []string{agentproto.ExecFreezeUpper}, wantCode: agentproto.CodeUnsupported},
		{name: "freeze, bad auto-thaw", argv: []string{agentproto.ExecFreezeUpper, "soon"}, wantCode: agentproto.CodeInvalidRequest},
		{name: "freeze, zero auto-thaw", argv: []string{agentproto.ExecFreezeUpper, "0"}, wantCode: agentproto.CodeInvalidRequest},
		{name: "thaw, nothing frozen", argv: []string{agentproto.ExecThawUpper}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next := &recordingRunner{}
			b := &builtinExec{next: next, upper: &upperFreezer{log: hclog.NewNullLogger()}}
			st, err := b.Run(context.Background(), &agentproto.ExecRequest{Argv: tc.argv}, guest.ExecIO{})
			assert.Check(t, is.Equal(len(next.got) == 1, tc.wantNext))
			if tc.wantCode != "" {
				var ae *agentproto.Error
				assert.Assert(t, errors.As(err, &ae), "%v", err)
				assert.Check(t, is.Equal(ae.Code, tc.wantCode))
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(st.ExitCode, tc.wantExit))
		})
	}
}
