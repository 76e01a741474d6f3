package agentclient

import (
	"context"
	"fmt"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// The agent cannot import the contract package (it would pull gRPC into
// the guest binary), so its S-codes are spelled out in agentproto; this
// keeps them in step with the contract's table.
func TestAgentCodesAreContractCodes(t *testing.T) {
	for _, code := range []string{
		agentproto.CodeInvalidRequest, agentproto.CodeFSInvalid, agentproto.CodeFSNotFound, agentproto.CodeFSWrongType,
		agentproto.CodeFSExists, agentproto.CodeFSNotEmpty, agentproto.CodeFSPermission, agentproto.CodeFSIO,
		agentproto.CodeFSRegex, agentproto.CodeFSAborted, agentproto.CodeFSUnsupported,
	} {
		info, ok := contract.LookupCode(contract.Code(code))
		assert.Assert(t, ok, "%s is not in the contract's table", code)
		if code != agentproto.CodeInvalidRequest && code != agentproto.CodeFSAborted {
			assert.Equal(t, info.Type, contract.TypeFilesystem, code)
		}
	}
}

func TestContractError(t *testing.T) {
	parent := &agentproto.Error{Code: agentproto.CodeFSNotFound, Message: "parent directory not found: /a", ParentMissing: true}
	tests := []struct {
		name    string
		err     error
		op      string
		code    contract.Code
		withFix bool
	}{
		{"parent missing on write", parent, agentproto.OpWrite, contract.S211, true},
		{"parent missing on mkdir", parent, agentproto.OpMkdir, contract.S211, true},
		{"parent missing on mv has no fix", parent, agentproto.OpMv, contract.S211, false},
		{"plain not found", &agentproto.Error{Code: "S211", Message: "x"}, agentproto.OpWrite, contract.S211, false},
		{"regex", &agentproto.Error{Code: "S217", Message: "x"}, agentproto.OpGrep, contract.S217, false},
		{"agent channel", &agentproto.Error{Code: agentproto.CodeDisconnected, Message: "closed"}, "exec", contract.S300, false},
		{"deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), "exec", contract.S300, false},
		{"other", fmt.Errorf("boom"), "exec", contract.S300, false},
		{"already contract", contract.NewError(contract.S003, "busy"), "exec", contract.S003, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := ContractError(tc.err, tc.op)
			assert.Equal(t, e.Code, tc.code)
			assert.Equal(t, e.Fix != nil, tc.withFix)
			if tc.withFix {
				assert.DeepEqual(t, e.Fix, contract.ParentsFix())
			}
		})
	}
	assert.Assert(t, ContractError(nil, "exec") == nil)
}
