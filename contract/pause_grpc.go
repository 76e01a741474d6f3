package contract

import (
	"context"

	pb "github.com/iii-sandbox/iii/contract/proto"
)

// The sandbox::pause and sandbox::resume RPCs of GRPCServer and GRPCClient.

// servePause runs one pause operation; an adapter without PauseAdapter
// answers S006.
func servePause[Req any](ctx context.Context, s *GRPCServer, op string, req *Req,
	call func(PauseAdapter, context.Context, *Req) (*SandboxStatus, error),
) (*pb.SandboxStatusResponse, error) {
	p, ok := s.impl.(PauseAdapter)
	if !ok {
		return nil, errorStatus(ctx, op, PauseUnsupported("", op))
	}
	return serve(ctx, op, req, func(ctx context.Context, r *Req) (*SandboxStatus, error) { return call(p, ctx, r) }, sandboxStatusToProto)
}

// Pause serves sandbox::pause.
func (s *GRPCServer) Pause(ctx context.Context, in *pb.PauseRequest) (*pb.SandboxStatusResponse, error) {
	return servePause(ctx, s, OpPause, &PauseRequest{SandboxID: in.GetSandboxId()}, PauseAdapter.Pause)
}

// Resume serves sandbox::resume.
func (s *GRPCServer) Resume(ctx context.Context, in *pb.ResumeRequest) (*pb.SandboxStatusResponse, error) {
	return servePause(ctx, s, OpResume, &ResumeRequest{SandboxID: in.GetSandboxId()}, PauseAdapter.Resume)
}

var _ PauseAdapter = (*GRPCClient)(nil)

// Pause calls sandbox::pause.
func (c *GRPCClient) Pause(ctx context.Context, req *PauseRequest) (*SandboxStatus, error) {
	return call(ctx, OpPause, req, func(r *PauseRequest) *pb.PauseRequest { return &pb.PauseRequest{SandboxId: validUTF8(r.SandboxID)} },
		c.client.Pause, sandboxStatusFromProto)
}

// Resume calls sandbox::resume.
func (c *GRPCClient) Resume(ctx context.Context, req *ResumeRequest) (*SandboxStatus, error) {
	return call(ctx, OpResume, req, func(r *ResumeRequest) *pb.ResumeRequest { return &pb.ResumeRequest{SandboxId: validUTF8(r.SandboxID)} },
		c.client.Resume, sandboxStatusFromProto)
}

func sandboxStatusToProto(s *SandboxStatus) *pb.SandboxStatusResponse {
	return &pb.SandboxStatusResponse{SandboxId: validUTF8(s.SandboxID), Status: validUTF8(s.Status)}
}

func sandboxStatusFromProto(p *pb.SandboxStatusResponse) *SandboxStatus {
	return &SandboxStatus{SandboxID: p.GetSandboxId(), Status: p.GetStatus()}
}
