package contract

import (
	"encoding/json"
	"math"
	"unicode/utf8"

	pb "github.com/iii-sandbox/iii/contract/proto"
)

// Explicit converters between the contract's Go types and the generated
// proto types, one pair per type. They are the only place that knows both
// shapes, so a field added to one side and forgotten on the other shows up
// in the round-trip table test.
//
// Proto3 refuses to marshal a string field holding invalid UTF-8. Strings
// that come from inside a sandbox (file names, grep lines, sed errors) may
// hold any bytes, so every string headed for the wire passes through
// validUTF8, which replaces each invalid byte with U+FFFD: the same thing
// JSON encoding does to them later anyway. Process output travels as bytes
// and is left untouched.

// validUTF8 replaces each byte that is not part of valid UTF-8 with U+FFFD,
// as encoding/json does.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	out := make([]rune, 0, len(s))
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		out = append(out, r)
		i += size
	}
	return string(out)
}

func validUTF8s(in []string) []string {
	if in == nil {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = validUTF8(s)
	}
	return out
}

// nilIfEmpty keeps "no items" as nil on the Go side whatever the wire did.
func nilIfEmpty[T any](in []T) []T {
	if len(in) == 0 {
		return nil
	}
	return in
}

func errorToProto(e *Error) *pb.SandboxError {
	out := &pb.SandboxError{
		Type:      validUTF8(e.Type),
		Code:      validUTF8(string(e.Code)),
		Message:   validUTF8(e.Message),
		DocsUrl:   validUTF8(e.DocsURL),
		Retryable: e.Retryable,
		FixNote:   validUTF8(e.FixNote),
	}
	if e.Fix != nil {
		if b, err := json.Marshal(e.Fix); err == nil {
			out.FixJson = b
		}
	}
	return out
}

func errorFromProto(p *pb.SandboxError) *Error {
	e := &Error{
		Type:      p.GetType(),
		Code:      Code(p.GetCode()),
		Message:   p.GetMessage(),
		DocsURL:   p.GetDocsUrl(),
		Retryable: p.GetRetryable(),
		FixNote:   p.GetFixNote(),
	}
	if p.FixJson != nil {
		var fix map[string]any
		if json.Unmarshal(p.FixJson, &fix) == nil {
			e.Fix = fix
		}
	}
	return e
}

func infoToProto(a *AdapterInfo) *pb.InfoResponse {
	out := &pb.InfoResponse{
		Adapter:        validUTF8(a.Adapter),
		AdapterVersion: validUTF8(a.AdapterVersion),
		Contract:       &pb.ContractVersion{Major: a.Contract.Major, Minor: a.Contract.Minor},
		Capabilities:   validUTF8s(a.Capabilities),
	}
	if len(a.Facts) > 0 {
		if b, err := json.Marshal(a.Facts); err == nil {
			out.FactsJson = b
		}
	}
	return out
}

func infoFromProto(p *pb.InfoResponse) *AdapterInfo {
	a := &AdapterInfo{
		Adapter:        p.GetAdapter(),
		AdapterVersion: p.GetAdapterVersion(),
		Contract:       ContractVersion{Major: p.GetContract().GetMajor(), Minor: p.GetContract().GetMinor()},
		Capabilities:   nilIfEmpty(p.GetCapabilities()),
	}
	if len(p.GetFactsJson()) > 0 {
		var facts map[string]any
		if json.Unmarshal(p.GetFactsJson(), &facts) == nil && len(facts) > 0 {
			a.Facts = facts
		}
	}
	return a
}

func createRequestToProto(r *CreateRequest) *pb.CreateRequest {
	return &pb.CreateRequest{
		Image:           validUTF8(r.Image),
		Cpus:            r.CPUs,
		MemoryMb:        r.MemoryMB,
		Name:            validUTF8(r.Name),
		Network:         r.Network,
		IdleTimeoutSecs: r.IdleTimeoutSecs,
		Env:             validUTF8s(r.Env),
	}
}

func createRequestFromProto(p *pb.CreateRequest) *CreateRequest {
	return &CreateRequest{
		Image:           p.GetImage(),
		CPUs:            p.Cpus,
		MemoryMB:        p.MemoryMb,
		Name:            p.GetName(),
		Network:         p.GetNetwork(),
		IdleTimeoutSecs: p.IdleTimeoutSecs,
		Env:             nilIfEmpty(p.GetEnv()),
	}
}

func createResponseToProto(r *CreateResponse) *pb.CreateResponse {
	return &pb.CreateResponse{SandboxId: validUTF8(r.SandboxID), Image: validUTF8(r.Image)}
}

func createResponseFromProto(p *pb.CreateResponse) *CreateResponse {
	return &CreateResponse{SandboxID: p.GetSandboxId(), Image: p.GetImage()}
}

func execRequestToProto(r *ExecRequest) *pb.ExecRequest {
	return &pb.ExecRequest{
		SandboxId: validUTF8(r.SandboxID),
		Argv:      validUTF8s(r.Argv),
		Stdin:     r.Stdin,
		Env:       validUTF8s(r.Env),
		TimeoutMs: r.TimeoutMS,
		Workdir:   validUTF8(r.Workdir),
	}
}

func execRequestFromProto(p *pb.ExecRequest) *ExecRequest {
	return &ExecRequest{
		SandboxID: p.GetSandboxId(),
		Argv:      nilIfEmpty(p.GetArgv()),
		Stdin:     nilIfEmpty(p.GetStdin()),
		Env:       nilIfEmpty(p.GetEnv()),
		TimeoutMS: p.GetTimeoutMs(),
		Workdir:   p.GetWorkdir(),
	}
}

// clampInt32 keeps an exit code representable on the wire; real exit codes
// are 0–255, and anything else is an adapter's own convention.
func clampInt32(v int) int32 {
	switch {
	case v > math.MaxInt32:
		return math.MaxInt32
	case v < math.MinInt32:
		return math.MinInt32
	}
	return int32(v)
}

func execResponseToProto(r *ExecResponse) *pb.ExecResponse {
	out := &pb.ExecResponse{
		Stdout:          []byte(r.Stdout),
		Stderr:          []byte(r.Stderr),
		TimedOut:        r.TimedOut,
		DurationMs:      r.DurationMS,
		Success:         r.Success,
		StdoutTruncated: r.StdoutTruncated,
		StderrTruncated: r.StderrTruncated,
	}
	if r.ExitCode != nil {
		c := clampInt32(*r.ExitCode)
		out.ExitCode = &c
	}
	return out
}

func execResponseFromProto(p *pb.ExecResponse) *ExecResponse {
	out := &ExecResponse{
		Stdout:          string(p.GetStdout()),
		Stderr:          string(p.GetStderr()),
		TimedOut:        p.GetTimedOut(),
		DurationMS:      p.GetDurationMs(),
		Success:         p.GetSuccess(),
		StdoutTruncated: p.GetStdoutTruncated(),
		StderrTruncated: p.GetStderrTruncated(),
	}
	if p != nil && p.ExitCode != nil {
		c := int(*p.ExitCode)
		out.ExitCode = &c
	}
	return out
}

func runRequestToProto(r *RunRequest) *pb.RunRequest {
	out := &pb.RunRequest{
		Image:       validUTF8(r.Image),
		Code:        validUTF8(r.Code),
		Lang:        validUTF8(r.Lang),
		Env:         validUTF8s(r.Env),
		Stdin:       r.Stdin,
		TimeoutMs:   r.TimeoutMS,
		KeepSandbox: r.KeepSandbox,
	}
	for _, f := range r.Files {
		out.Files = append(out.Files, &pb.RunFile{Path: validUTF8(f.Path), Content: validUTF8(f.Content)})
	}
	return out
}

func runRequestFromProto(p *pb.RunRequest) *RunRequest {
	out := &RunRequest{
		Image:       p.GetImage(),
		Code:        p.GetCode(),
		Lang:        p.GetLang(),
		Env:         nilIfEmpty(p.GetEnv()),
		Stdin:       nilIfEmpty(p.GetStdin()),
		TimeoutMS:   p.GetTimeoutMs(),
		KeepSandbox: p.GetKeepSandbox(),
	}
	for _, f := range p.GetFiles() {
		out.Files = append(out.Files, RunFile{Path: f.GetPath(), Content: f.GetContent()})
	}
	return out
}

func runResponseToProto(r *RunResponse) *pb.RunResponse {
	return &pb.RunResponse{Result: execResponseToProto(&r.ExecResponse), SandboxId: validUTF8(r.SandboxID)}
}

func runResponseFromProto(p *pb.RunResponse) *RunResponse {
	return &RunResponse{ExecResponse: *execResponseFromProto(p.GetResult()), SandboxID: p.GetSandboxId()}
}

func listResponseToProto(r *ListResponse) *pb.ListResponse {
	out := &pb.ListResponse{}
	for _, s := range r.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, &pb.ListEntry{
			SandboxId:      validUTF8(s.SandboxID),
			Name:           validUTF8(s.Name),
			Image:          validUTF8(s.Image),
			AgeSecs:        s.AgeSecs,
			ExecInProgress: s.ExecInProgress,
			ExecInFlight:   s.ExecInFlight,
			ExecSlotsFree:  s.ExecSlotsFree,
			Stopped:        s.Stopped,
			Paused:         s.Paused,
		})
	}
	return out
}

func listResponseFromProto(p *pb.ListResponse) *ListResponse {
	out := &ListResponse{}
	for _, s := range p.GetSandboxes() {
		out.Sandboxes = append(out.Sandboxes, ListEntry{
			SandboxID:      s.GetSandboxId(),
			Name:           s.GetName(),
			Image:          s.GetImage(),
			AgeSecs:        s.GetAgeSecs(),
			ExecInProgress: s.GetExecInProgress(),
			ExecInFlight:   s.GetExecInFlight(),
			ExecSlotsFree:  s.GetExecSlotsFree(),
			Stopped:        s.GetStopped(),
			Paused:         s.GetPaused(),
		})
	}
	return out
}

func stopRequestToProto(r *StopRequest) *pb.StopRequest {
	return &pb.StopRequest{SandboxId: validUTF8(r.SandboxID), Wait: r.Wait}
}

func stopRequestFromProto(p *pb.StopRequest) *StopRequest {
	return &StopRequest{SandboxID: p.GetSandboxId(), Wait: p.GetWait()}
}

func stopResponseToProto(r *StopResponse) *pb.StopResponse {
	return &pb.StopResponse{SandboxId: validUTF8(r.SandboxID), Stopped: r.Stopped}
}

func stopResponseFromProto(p *pb.StopResponse) *StopResponse {
	return &StopResponse{SandboxID: p.GetSandboxId(), Stopped: p.GetStopped()}
}

func catalogListResponseToProto(r *CatalogListResponse) *pb.CatalogListResponse {
	out := &pb.CatalogListResponse{}
	for _, im := range r.Images {
		out.Images = append(out.Images, &pb.CatalogImage{Name: validUTF8(im.Name), OciRef: validUTF8(im.OCIRef), Kind: validUTF8(im.Kind)})
	}
	return out
}

func catalogListResponseFromProto(p *pb.CatalogListResponse) *CatalogListResponse {
	out := &CatalogListResponse{}
	for _, im := range p.GetImages() {
		out.Images = append(out.Images, CatalogImage{Name: im.GetName(), OCIRef: im.GetOciRef(), Kind: im.GetKind()})
	}
	return out
}

func fsEntryToProto(e *FsEntry) *pb.FsEntry {
	return &pb.FsEntry{
		Name:      validUTF8(e.Name),
		IsDir:     e.IsDir,
		Size:      e.Size,
		Mode:      uint32(e.Mode),
		Mtime:     e.Mtime,
		IsSymlink: e.IsSymlink,
	}
}

func fsEntryFromProto(p *pb.FsEntry) FsEntry {
	return FsEntry{
		Name:      p.GetName(),
		IsDir:     p.GetIsDir(),
		Size:      p.GetSize(),
		Mode:      Mode(p.GetMode()),
		Mtime:     p.GetMtime(),
		IsSymlink: p.GetIsSymlink(),
	}
}

func fsLsRequestToProto(r *FsLsRequest) *pb.FsLsRequest {
	return &pb.FsLsRequest{SandboxId: validUTF8(r.SandboxID), Path: validUTF8(r.Path)}
}

func fsLsRequestFromProto(p *pb.FsLsRequest) *FsLsRequest {
	return &FsLsRequest{SandboxID: p.GetSandboxId(), Path: p.GetPath()}
}

func fsLsResponseToProto(r *FsLsResponse) *pb.FsLsResponse {
	out := &pb.FsLsResponse{}
	for i := range r.Entries {
		out.Entries = append(out.Entries, fsEntryToProto(&r.Entries[i]))
	}
	return out
}

func fsLsResponseFromProto(p *pb.FsLsResponse) *FsLsResponse {
	out := &FsLsResponse{}
	for _, e := range p.GetEntries() {
		out.Entries = append(out.Entries, fsEntryFromProto(e))
	}
	return out
}

func fsStatRequestToProto(r *FsStatRequest) *pb.FsStatRequest {
	return &pb.FsStatRequest{SandboxId: validUTF8(r.SandboxID), Path: validUTF8(r.Path)}
}

func fsStatRequestFromProto(p *pb.FsStatRequest) *FsStatRequest {
	return &FsStatRequest{SandboxID: p.GetSandboxId(), Path: p.GetPath()}
}

func fsStatResponseToProto(e *FsEntry) *pb.FsStatResponse {
	return &pb.FsStatResponse{Entry: fsEntryToProto(e)}
}

func fsStatResponseFromProto(p *pb.FsStatResponse) *FsEntry {
	e := fsEntryFromProto(p.GetEntry())
	return &e
}

func fsMkdirRequestToProto(r *FsMkdirRequest) *pb.FsMkdirRequest {
	return &pb.FsMkdirRequest{SandboxId: validUTF8(r.SandboxID), Path: validUTF8(r.Path), Mode: uint32(r.Mode), Parents: r.Parents}
}

func fsMkdirRequestFromProto(p *pb.FsMkdirRequest) *FsMkdirRequest {
	return &FsMkdirRequest{SandboxID: p.GetSandboxId(), Path: p.GetPath(), Mode: Mode(p.GetMode()), Parents: p.GetParents()}
}

func fsMkdirResponseToProto(r *FsMkdirResponse) *pb.FsMkdirResponse {
	return &pb.FsMkdirResponse{Created: r.Created}
}

func fsMkdirResponseFromProto(p *pb.FsMkdirResponse) *FsMkdirResponse {
	return &FsMkdirResponse{Created: p.GetCreated()}
}

// fsWriteHeaderToProto carries everything but the content, which follows
// the header as a stream of chunks.
func fsWriteHeaderToProto(r *FsWriteRequest) *pb.FsWriteHeader {
	return &pb.FsWriteHeader{SandboxId: validUTF8(r.SandboxID), Path: validUTF8(r.Path), Mode: uint32(r.Mode), Parents: r.Parents}
}

func fsWriteHeaderFromProto(p *pb.FsWriteHeader) *FsWriteRequest {
	return &FsWriteRequest{SandboxID: p.GetSandboxId(), Path: p.GetPath(), Mode: Mode(p.GetMode()), Parents: p.GetParents()}
}

func fsWriteResponseToProto(r *FsWriteResponse) *pb.FsWriteResponse {
	return &pb.FsWriteResponse{BytesWritten: r.BytesWritten, Path: validUTF8(r.Path)}
}

func fsWriteResponseFromProto(p *pb.FsWriteResponse) *FsWriteResponse {
	return &FsWriteResponse{BytesWritten: p.GetBytesWritten(), Path: p.GetPath()}
}

func fsReadRequestToProto(r *FsReadRequest) *pb.FsReadRequest {
	return &pb.FsReadRequest{SandboxId: validUTF8(r.SandboxID), Path: validUTF8(r.Path)}
}

func fsReadRequestFromProto(p *pb.FsReadRequest) *FsReadRequest {
	return &FsReadRequest{SandboxID: p.GetSandboxId(), Path: p.GetPath()}
}

func fsReadMetaToProto(m *FsReadMeta) *pb.FsReadMeta {
	return &pb.FsReadMeta{Size: m.Size, Mode: uint32(m.Mode), Mtime: m.Mtime}
}

func fsReadMetaFromProto(p *pb.FsReadMeta) *FsReadMeta {
	return &FsReadMeta{Size: p.GetSize(), Mode: Mode(p.GetMode()), Mtime: p.GetMtime()}
}

func fsRmRequestToProto(r *FsRmRequest) *pb.FsRmRequest {
	return &pb.FsRmRequest{SandboxId: validUTF8(r.SandboxID), Path: validUTF8(r.Path), Recursive: r.Recursive}
}

func fsRmRequestFromProto(p *pb.FsRmRequest) *FsRmRequest {
	return &FsRmRequest{SandboxID: p.GetSandboxId(), Path: p.GetPath(), Recursive: p.GetRecursive()}
}

func fsRmResponseToProto(r *FsRmResponse) *pb.FsRmResponse {
	return &pb.FsRmResponse{Removed: r.Removed}
}

func fsRmResponseFromProto(p *pb.FsRmResponse) *FsRmResponse {
	return &FsRmResponse{Removed: p.GetRemoved()}
}

func fsChmodRequestToProto(r *FsChmodRequest) *pb.FsChmodRequest {
	return &pb.FsChmodRequest{
		SandboxId: validUTF8(r.SandboxID),
		Path:      validUTF8(r.Path),
		Mode:      uint32(r.Mode),
		Uid:       r.UID,
		Gid:       r.GID,
		Recursive: r.Recursive,
	}
}

func fsChmodRequestFromProto(p *pb.FsChmodRequest) *FsChmodRequest {
	return &FsChmodRequest{
		SandboxID: p.GetSandboxId(),
		Path:      p.GetPath(),
		Mode:      Mode(p.GetMode()),
		UID:       p.Uid,
		GID:       p.Gid,
		Recursive: p.GetRecursive(),
	}
}

func fsChmodResponseToProto(r *FsChmodResponse) *pb.FsChmodResponse {
	return &pb.FsChmodResponse{Updated: r.Updated}
}

func fsChmodResponseFromProto(p *pb.FsChmodResponse) *FsChmodResponse {
	return &FsChmodResponse{Updated: p.GetUpdated()}
}

func fsMvRequestToProto(r *FsMvRequest) *pb.FsMvRequest {
	return &pb.FsMvRequest{SandboxId: validUTF8(r.SandboxID), Src: validUTF8(r.Src), Dst: validUTF8(r.Dst), Overwrite: r.Overwrite}
}

func fsMvRequestFromProto(p *pb.FsMvRequest) *FsMvRequest {
	return &FsMvRequest{SandboxID: p.GetSandboxId(), Src: p.GetSrc(), Dst: p.GetDst(), Overwrite: p.GetOverwrite()}
}

func fsMvResponseToProto(r *FsMvResponse) *pb.FsMvResponse {
	return &pb.FsMvResponse{Moved: r.Moved}
}

func fsMvResponseFromProto(p *pb.FsMvResponse) *FsMvResponse {
	return &FsMvResponse{Moved: p.GetMoved()}
}

func fsGrepRequestToProto(r *FsGrepRequest) *pb.FsGrepRequest {
	return &pb.FsGrepRequest{
		SandboxId:    validUTF8(r.SandboxID),
		Path:         validUTF8(r.Path),
		Pattern:      validUTF8(r.Pattern),
		Recursive:    r.Recursive,
		IgnoreCase:   r.IgnoreCase,
		IncludeGlob:  validUTF8s(r.IncludeGlob),
		ExcludeGlob:  validUTF8s(r.ExcludeGlob),
		MaxMatches:   r.MaxMatches,
		MaxLineBytes: r.MaxLineBytes,
	}
}

func fsGrepRequestFromProto(p *pb.FsGrepRequest) *FsGrepRequest {
	return &FsGrepRequest{
		SandboxID:    p.GetSandboxId(),
		Path:         p.GetPath(),
		Pattern:      p.GetPattern(),
		Recursive:    p.GetRecursive(),
		IgnoreCase:   p.GetIgnoreCase(),
		IncludeGlob:  nilIfEmpty(p.GetIncludeGlob()),
		ExcludeGlob:  nilIfEmpty(p.GetExcludeGlob()),
		MaxMatches:   p.GetMaxMatches(),
		MaxLineBytes: p.GetMaxLineBytes(),
	}
}

func fsGrepResponseToProto(r *FsGrepResponse) *pb.FsGrepResponse {
	out := &pb.FsGrepResponse{Truncated: r.Truncated}
	for _, m := range r.Matches {
		out.Matches = append(out.Matches, &pb.GrepMatch{Path: validUTF8(m.Path), Line: m.Line, Content: validUTF8(m.Content)})
	}
	return out
}

func fsGrepResponseFromProto(p *pb.FsGrepResponse) *FsGrepResponse {
	out := &FsGrepResponse{Truncated: p.GetTruncated()}
	for _, m := range p.GetMatches() {
		out.Matches = append(out.Matches, GrepMatch{Path: m.GetPath(), Line: m.GetLine(), Content: m.GetContent()})
	}
	return out
}

func fsSedRequestToProto(r *FsSedRequest) *pb.FsSedRequest {
	return &pb.FsSedRequest{
		SandboxId:   validUTF8(r.SandboxID),
		Files:       validUTF8s(r.Files),
		Path:        validUTF8(r.Path),
		Recursive:   r.Recursive,
		IncludeGlob: validUTF8s(r.IncludeGlob),
		ExcludeGlob: validUTF8s(r.ExcludeGlob),
		Pattern:     validUTF8(r.Pattern),
		Replacement: validUTF8(r.Replacement),
		Regex:       r.Regex,
		FirstOnly:   r.FirstOnly,
		IgnoreCase:  r.IgnoreCase,
	}
}

func fsSedRequestFromProto(p *pb.FsSedRequest) *FsSedRequest {
	return &FsSedRequest{
		SandboxID:   p.GetSandboxId(),
		Files:       nilIfEmpty(p.GetFiles()),
		Path:        p.GetPath(),
		Recursive:   p.GetRecursive(),
		IncludeGlob: nilIfEmpty(p.GetIncludeGlob()),
		ExcludeGlob: nilIfEmpty(p.GetExcludeGlob()),
		Pattern:     p.GetPattern(),
		Replacement: p.GetReplacement(),
		Regex:       p.GetRegex(),
		FirstOnly:   p.GetFirstOnly(),
		IgnoreCase:  p.GetIgnoreCase(),
	}
}

func fsSedResponseToProto(r *FsSedResponse) *pb.FsSedResponse {
	out := &pb.FsSedResponse{TotalReplacements: r.TotalReplacements}
	for _, s := range r.Results {
		out.Results = append(out.Results, &pb.SedResult{
			Path: validUTF8(s.Path), Replacements: s.Replacements, Success: s.Success, Error: validUTF8(s.Error),
		})
	}
	return out
}

func fsSedResponseFromProto(p *pb.FsSedResponse) *FsSedResponse {
	out := &FsSedResponse{TotalReplacements: p.GetTotalReplacements()}
	for _, s := range p.GetResults() {
		out.Results = append(out.Results, SedResult{
			Path: s.GetPath(), Replacements: s.GetReplacements(), Success: s.GetSuccess(), Error: s.GetError(),
		})
	}
	return out
}

func progressEventToProto(ev ProgressEvent) *pb.ProgressEvent {
	return &pb.ProgressEvent{
		Phase:      validUTF8(ev.Phase),
		Image:      validUTF8(ev.Image),
		ImageRef:   validUTF8(ev.ImageRef),
		BytesDone:  ev.BytesDone,
		BytesTotal: ev.BytesTotal,
		SandboxId:  validUTF8(ev.SandboxID),
	}
}

func progressEventFromProto(p *pb.ProgressEvent) ProgressEvent {
	if p == nil {
		return ProgressEvent{}
	}
	return ProgressEvent{
		Phase:      p.GetPhase(),
		Image:      p.GetImage(),
		ImageRef:   p.GetImageRef(),
		BytesDone:  p.BytesDone,
		BytesTotal: p.BytesTotal,
		SandboxID:  p.GetSandboxId(),
	}
}
