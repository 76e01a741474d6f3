package contract

import (
	pb "github.com/iii-sandbox/iii/contract/proto"
)

// Converters of the worker::* types, one pair per type, like convert.go.

func optInt32(p *int) *int32 {
	if p == nil {
		return nil
	}
	v := clampInt32(*p)
	return &v
}

func optInt(p *int32) *int {
	if p == nil {
		return nil
	}
	v := int(*p)
	return &v
}

func workerStartRequestToProto(r *WorkerStartRequest) *pb.WorkerStartRequest {
	out := &pb.WorkerStartRequest{
		VmId:      validUTF8(r.VMID),
		Name:      validUTF8(r.Name),
		Namespace: validUTF8(r.Namespace),
		Image:     validUTF8(r.Image),
		HostDir:   validUTF8(r.HostDir),
		Workdir:   validUTF8(r.Workdir),
		Install:   validUTF8(r.Install),
		Command:   validUTF8(r.Command),
		Env:       validUTF8s(r.Env),
		Cpus:      r.CPUs,
		MemoryMb:  r.MemoryMB,
		EngineUrl: validUTF8(r.EngineURL),
		Exclude:   validUTF8s(r.Exclude),
		Include:   validUTF8s(r.Include),
		Wait:      r.Wait,

		EngineCredential: validUTF8(r.EngineCredential),
	}
	if r.Config != nil {
		out.Config = &pb.WorkerConfigFile{FileName: validUTF8(r.Config.FileName), Content: validUTF8(r.Config.Content)}
	}
	return out
}

func workerStartRequestFromProto(p *pb.WorkerStartRequest) *WorkerStartRequest {
	out := &WorkerStartRequest{
		VMID:      p.GetVmId(),
		Name:      p.GetName(),
		Namespace: p.GetNamespace(),
		Image:     p.GetImage(),
		HostDir:   p.GetHostDir(),
		Workdir:   p.GetWorkdir(),
		Install:   p.GetInstall(),
		Command:   p.GetCommand(),
		Env:       nilIfEmpty(p.GetEnv()),
		CPUs:      p.Cpus,
		MemoryMB:  p.MemoryMb,
		EngineURL: p.GetEngineUrl(),
		Exclude:   nilIfEmpty(p.GetExclude()),
		Include:   nilIfEmpty(p.GetInclude()),
		Wait:      p.GetWait(),

		EngineCredential: p.GetEngineCredential(),
	}
	if c := p.GetConfig(); c != nil {
		out.Config = &WorkerConfigFile{FileName: c.GetFileName(), Content: c.GetContent()}
	}
	return out
}

func workerStartResponseToProto(r *WorkerStartResponse) *pb.WorkerStartResponse {
	return &pb.WorkerStartResponse{VmId: validUTF8(r.VMID), State: validUTF8(r.State), Pid: optInt32(r.PID)}
}

func workerStartResponseFromProto(p *pb.WorkerStartResponse) *WorkerStartResponse {
	return &WorkerStartResponse{VMID: p.GetVmId(), State: p.GetState(), PID: optInt(p.Pid)}
}

func workerStopRequestToProto(r *WorkerStopRequest) *pb.WorkerStopRequest {
	return &pb.WorkerStopRequest{VmId: validUTF8(r.VMID), TimeoutMs: r.TimeoutMS}
}

func workerStopRequestFromProto(p *pb.WorkerStopRequest) *WorkerStopRequest {
	return &WorkerStopRequest{VMID: p.GetVmId(), TimeoutMS: p.GetTimeoutMs()}
}

func workerStatusRequestToProto(r *WorkerStatusRequest) *pb.WorkerStatusRequest {
	return &pb.WorkerStatusRequest{VmId: validUTF8(r.VMID)}
}

func workerStatusRequestFromProto(p *pb.WorkerStatusRequest) *WorkerStatusRequest {
	return &WorkerStatusRequest{VMID: p.GetVmId()}
}

func workerStatusToProto(s *WorkerStatus) *pb.WorkerStatusResponse {
	return &pb.WorkerStatusResponse{
		VmId:      validUTF8(s.VMID),
		Name:      validUTF8(s.Name),
		Namespace: validUTF8(s.Namespace),
		Image:     validUTF8(s.Image),
		State:     validUTF8(s.State),
		Pid:       optInt32(s.PID),
		ExitCode:  optInt32(s.ExitCode),
		StartedAt: validUTF8(s.StartedAt),
		Restarts:  s.Restarts,
		LastError: validUTF8(s.LastError),
		StateDir:  validUTF8(s.StateDir),
	}
}

func workerStatusFromProto(p *pb.WorkerStatusResponse) *WorkerStatus {
	return &WorkerStatus{
		VMID:      p.GetVmId(),
		Name:      p.GetName(),
		Namespace: p.GetNamespace(),
		Image:     p.GetImage(),
		State:     p.GetState(),
		PID:       optInt(p.Pid),
		ExitCode:  optInt(p.ExitCode),
		StartedAt: p.GetStartedAt(),
		Restarts:  p.GetRestarts(),
		LastError: p.GetLastError(),
		StateDir:  p.GetStateDir(),
	}
}

func workerListResponseToProto(r *WorkerListResponse) *pb.WorkerListResponse {
	out := &pb.WorkerListResponse{Workers: make([]*pb.WorkerStatusResponse, 0, len(r.Workers))}
	for i := range r.Workers {
		out.Workers = append(out.Workers, workerStatusToProto(&r.Workers[i]))
	}
	return out
}

func workerListResponseFromProto(p *pb.WorkerListResponse) *WorkerListResponse {
	out := &WorkerListResponse{}
	for _, w := range p.GetWorkers() {
		out.Workers = append(out.Workers, *workerStatusFromProto(w))
	}
	return out
}

func workerLogsRequestToProto(r *WorkerLogsRequest) *pb.WorkerLogsRequest {
	return &pb.WorkerLogsRequest{VmId: validUTF8(r.VMID), Tail: r.Tail, Cursor: r.Cursor}
}

func workerLogsRequestFromProto(p *pb.WorkerLogsRequest) *WorkerLogsRequest {
	return &WorkerLogsRequest{VMID: p.GetVmId(), Tail: p.GetTail(), Cursor: p.Cursor}
}

func workerLogsResponseToProto(r *WorkerLogsResponse) *pb.WorkerLogsResponse {
	out := &pb.WorkerLogsResponse{
		VmId:      validUTF8(r.VMID),
		Entries:   make([]*pb.WorkerLogEntry, 0, len(r.Entries)),
		Cursor:    r.Cursor,
		Truncated: r.Truncated,
		More:      r.More,
	}
	for _, e := range r.Entries {
		out.Entries = append(out.Entries, &pb.WorkerLogEntry{
			Seq: e.Seq, Time: validUTF8(e.Time), Stream: validUTF8(e.Stream), Message: []byte(e.Message),
		})
	}
	return out
}

func workerLogsResponseFromProto(p *pb.WorkerLogsResponse) *WorkerLogsResponse {
	out := &WorkerLogsResponse{VMID: p.GetVmId(), Cursor: p.GetCursor(), Truncated: p.GetTruncated(), More: p.GetMore()}
	for _, e := range p.GetEntries() {
		out.Entries = append(out.Entries, WorkerLogEntry{Seq: e.GetSeq(), Time: e.GetTime(), Stream: e.GetStream(), Message: string(e.GetMessage())})
	}
	return out
}

func workerRemoveRequestToProto(r *WorkerRemoveRequest) *pb.WorkerRemoveRequest {
	return &pb.WorkerRemoveRequest{VmId: validUTF8(r.VMID)}
}

func workerRemoveRequestFromProto(p *pb.WorkerRemoveRequest) *WorkerRemoveRequest {
	return &WorkerRemoveRequest{VMID: p.GetVmId()}
}

func workerRemoveResponseToProto(r *WorkerRemoveResponse) *pb.WorkerRemoveResponse {
	return &pb.WorkerRemoveResponse{VmId: validUTF8(r.VMID), Removed: r.Removed, StateDir: validUTF8(r.StateDir)}
}

func workerRemoveResponseFromProto(p *pb.WorkerRemoveResponse) *WorkerRemoveResponse {
	return &WorkerRemoveResponse{VMID: p.GetVmId(), Removed: p.GetRemoved(), StateDir: p.GetStateDir()}
}
