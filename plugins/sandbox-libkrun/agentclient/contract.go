package agentclient

import (
	"context"
	"errors"
	"strings"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// ContractError turns an error from this package into the sandbox
// contract's error for operation op (an fs op name such as "write", or
// "exec"). The agent's S-codes pass through; the parent-missing S211 of
// mkdir and write gets fix {"parents": true}; failures of the agent channel
// itself (AGENT_*) and a lost connection are platform failures (S300).
func ContractError(err error, op string) *contract.Error {
	if err == nil {
		return nil
	}
	var ce *contract.Error
	if errors.As(err, &ce) {
		return ce
	}
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		if strings.HasPrefix(ae.Code, "S") {
			e := contract.NewError(contract.Code(ae.Code), "%s", ae.Message)
			if ae.Code == agentproto.CodeFSNotFound && ae.ParentMissing && (op == agentproto.OpWrite || op == agentproto.OpMkdir) {
				e = e.WithFix(contract.ParentsFix())
			}
			return e
		}
		return contract.NewError(contract.S300, "guest agent: %s", ae.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return contract.NewError(contract.S300, "guest agent did not answer: %v", err)
	}
	return contract.AsError(err, contract.S300)
}
