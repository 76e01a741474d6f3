package contract

import (
	"context"

	pb "github.com/iii-sandbox/iii/contract/proto"
)

// The worker::* RPCs of GRPCServer and GRPCClient.

// workerImpl returns the served adapter's worker side, or the error every
// worker call gets from an adapter without one.
func (s *GRPCServer) workerImpl(op string) (WorkerAdapter, error) {
	if w, ok := s.impl.(WorkerAdapter); ok {
		return w, nil
	}
	return nil, NewError(S300, "this sandbox adapter does not run worker VMs (%s); use an adapter that announces the %q capability in adapter::info, such as sandbox-libkrun", op, CapabilityWorker)
}

// serveWorker runs one worker operation.
func serveWorker[Req, Resp, PbResp any](ctx context.Context, s *GRPCServer, op string, req *Req,
	call func(WorkerAdapter, context.Context, *Req) (*Resp, error), to func(*Resp) PbResp,
) (PbResp, error) {
	w, err := s.workerImpl(op)
	if err != nil {
		var zero PbResp
		return zero, errorStatus(ctx, op, err)
	}
	return serve(ctx, op, req, func(ctx context.Context, r *Req) (*Resp, error) { return call(w, ctx, r) }, to)
}

// WorkerStart serves worker::start.
func (s *GRPCServer) WorkerStart(ctx context.Context, in *pb.WorkerStartRequest) (*pb.WorkerStartResponse, error) {
	return serveWorker(ctx, s, OpWorkerStart, workerStartRequestFromProto(in), WorkerAdapter.WorkerStart, workerStartResponseToProto)
}

// WorkerStop serves worker::stop.
func (s *GRPCServer) WorkerStop(ctx context.Context, in *pb.WorkerStopRequest) (*pb.WorkerStatusResponse, error) {
	return serveWorker(ctx, s, OpWorkerStop, workerStopRequestFromProto(in), WorkerAdapter.WorkerStop, workerStatusToProto)
}

// WorkerStatus serves worker::status.
func (s *GRPCServer) WorkerStatus(ctx context.Context, in *pb.WorkerStatusRequest) (*pb.WorkerStatusResponse, error) {
	return serveWorker(ctx, s, OpWorkerStatus, workerStatusRequestFromProto(in), WorkerAdapter.WorkerStatus, workerStatusToProto)
}

// WorkerList serves worker::list.
func (s *GRPCServer) WorkerList(ctx context.Context, _ *pb.WorkerListRequest) (*pb.WorkerListResponse, error) {
	return serveWorker(ctx, s, OpWorkerList, &WorkerListRequest{}, WorkerAdapter.WorkerList, workerListResponseToProto)
}

// WorkerLogs serves worker::logs.
func (s *GRPCServer) WorkerLogs(ctx context.Context, in *pb.WorkerLogsRequest) (*pb.WorkerLogsResponse, error) {
	return serveWorker(ctx, s, OpWorkerLogs, workerLogsRequestFromProto(in), WorkerAdapter.WorkerLogs, workerLogsResponseToProto)
}

// WorkerRemove serves worker::remove.
func (s *GRPCServer) WorkerRemove(ctx context.Context, in *pb.WorkerRemoveRequest) (*pb.WorkerRemoveResponse, error) {
	return serveWorker(ctx, s, OpWorkerRemove, workerRemoveRequestFromProto(in), WorkerAdapter.WorkerRemove, workerRemoveResponseToProto)
}

var _ WorkerAdapter = (*GRPCClient)(nil)

// WorkerStart calls worker::start.
func (c *GRPCClient) WorkerStart(ctx context.Context, req *WorkerStartRequest) (*WorkerStartResponse, error) {
	return call(ctx, OpWorkerStart, req, workerStartRequestToProto, c.client.WorkerStart, workerStartResponseFromProto)
}

// WorkerStop calls worker::stop.
func (c *GRPCClient) WorkerStop(ctx context.Context, req *WorkerStopRequest) (*WorkerStatus, error) {
	return call(ctx, OpWorkerStop, req, workerStopRequestToProto, c.client.WorkerStop, workerStatusFromProto)
}

// WorkerStatus calls worker::status.
func (c *GRPCClient) WorkerStatus(ctx context.Context, req *WorkerStatusRequest) (*WorkerStatus, error) {
	return call(ctx, OpWorkerStatus, req, workerStatusRequestToProto, c.client.WorkerStatus, workerStatusFromProto)
}

// WorkerList calls worker::list.
func (c *GRPCClient) WorkerList(ctx context.Context, req *WorkerListRequest) (*WorkerListResponse, error) {
	return call(ctx, OpWorkerList, req, func(*WorkerListRequest) *pb.WorkerListRequest { return &pb.WorkerListRequest{} },
		c.client.WorkerList, workerListResponseFromProto)
}

// WorkerLogs calls worker::logs.
func (c *GRPCClient) WorkerLogs(ctx context.Context, req *WorkerLogsRequest) (*WorkerLogsResponse, error) {
	return call(ctx, OpWorkerLogs, req, workerLogsRequestToProto, c.client.WorkerLogs, workerLogsResponseFromProto)
}

// WorkerRemove calls worker::remove.
func (c *GRPCClient) WorkerRemove(ctx context.Context, req *WorkerRemoveRequest) (*WorkerRemoveResponse, error) {
	return call(ctx, OpWorkerRemove, req, workerRemoveRequestToProto, c.client.WorkerRemove, workerRemoveResponseFromProto)
}
