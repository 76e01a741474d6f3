package contract

import (
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp/cmpopts"
	pb "github.com/iii-sandbox/iii/contract/proto"
	"google.golang.org/protobuf/proto"
	"gotest.tools/v3/assert"
)

// roundTrip sends v through its converters and the real proto encoding.
func roundTrip[T any, P proto.Message](t *testing.T, v *T, to func(*T) P, from func(P) *T, fresh func() P) *T {
	t.Helper()
	b, err := proto.Marshal(to(v))
	assert.NilError(t, err)
	p := fresh()
	assert.NilError(t, proto.Unmarshal(b, p))
	return from(p)
}

func TestConvertRoundTrip(t *testing.T) {
	code := -1
	cases := []struct {
		name string
		run  func(t *testing.T) (got, want any)
	}{
		{"error with fix", func(t *testing.T) (any, any) {
			v := WrapRunStep(RunStepWriteCode, "x", NewError(S218, "stream closed"))
			return roundTrip(t, v, errorToProto, errorFromProto, func() *pb.SandboxError { return &pb.SandboxError{} }), v
		}},
		{"error without fix or note", func(t *testing.T) (any, any) {
			v := &Error{Type: TypeInternal, Code: "S999", Message: "m", DocsURL: "u"}
			return roundTrip(t, v, errorToProto, errorFromProto, func() *pb.SandboxError { return &pb.SandboxError{} }), v
		}},
		{"error with an empty fix object", func(t *testing.T) (any, any) {
			v := NewError(S001, "").WithFix(map[string]any{})
			got := roundTrip(t, v, errorToProto, errorFromProto, func() *pb.SandboxError { return &pb.SandboxError{} })
			assert.Assert(t, got.Fix != nil, "{} stays {} rather than null")
			return got, v
		}},
		{"info", func(t *testing.T) (any, any) {
			v := &AdapterInfo{Adapter: "a", AdapterVersion: "1", Contract: ContractVersion{1, 1}, Capabilities: []string{CapabilityWorker}, Facts: map[string]any{"k": "v", "n": float64(3)}}
			return roundTrip(t, v, infoToProto, infoFromProto, func() *pb.InfoResponse { return &pb.InfoResponse{} }), v
		}},
		{"info without facts", func(t *testing.T) (any, any) {
			v := &AdapterInfo{Adapter: "a", Contract: ContractVersion{1, 0}}
			return roundTrip(t, v, infoToProto, infoFromProto, func() *pb.InfoResponse { return &pb.InfoResponse{} }), v
		}},
		{"create request", func(t *testing.T) (any, any) {
			v := &CreateRequest{Image: "p", CPUs: ptr(uint32(0)), MemoryMB: ptr(uint32(9)), Name: "n", Network: true, IdleTimeoutSecs: ptr(uint64(0)), Env: []string{"A=1"}}
			return roundTrip(t, v, createRequestToProto, createRequestFromProto, func() *pb.CreateRequest { return &pb.CreateRequest{} }), v
		}},
		{"create request defaults stay absent", func(t *testing.T) (any, any) {
			v := &CreateRequest{Image: "p"}
			return roundTrip(t, v, createRequestToProto, createRequestFromProto, func() *pb.CreateRequest { return &pb.CreateRequest{} }), v
		}},
		{"create response", func(t *testing.T) (any, any) {
			v := &CreateResponse{SandboxID: sid, Image: "p"}
			return roundTrip(t, v, createResponseToProto, createResponseFromProto, func() *pb.CreateResponse { return &pb.CreateResponse{} }), v
		}},
		{"exec request", func(t *testing.T) (any, any) {
			v := &ExecRequest{SandboxID: sid, Argv: []string{"a", ""}, Stdin: []byte{0, 0xff}, Env: []string{"A=1"}, TimeoutMS: 5, Workdir: "/w"}
			return roundTrip(t, v, execRequestToProto, execRequestFromProto, func() *pb.ExecRequest { return &pb.ExecRequest{} }), v
		}},
		{"exec response keeps binary output", func(t *testing.T) (any, any) {
			v := &ExecResponse{Stdout: "\xff\xfe bin", Stderr: "e", ExitCode: &code, TimedOut: true, DurationMS: 3, Success: false, StdoutTruncated: true, StderrTruncated: true}
			return roundTrip(t, v, execResponseToProto, execResponseFromProto, func() *pb.ExecResponse { return &pb.ExecResponse{} }), v
		}},
		{"exec response exit code null", func(t *testing.T) (any, any) {
			v := &ExecResponse{Stdout: "x"}
			return roundTrip(t, v, execResponseToProto, execResponseFromProto, func() *pb.ExecResponse { return &pb.ExecResponse{} }), v
		}},
		{"exec response exit code zero", func(t *testing.T) (any, any) {
			v := &ExecResponse{ExitCode: ptr(0), Success: true}
			return roundTrip(t, v, execResponseToProto, execResponseFromProto, func() *pb.ExecResponse { return &pb.ExecResponse{} }), v
		}},
		{"run request", func(t *testing.T) (any, any) {
			v := &RunRequest{Image: "p", Code: "c", Lang: "py", Files: []RunFile{{"/a", "b"}, {"/c", ""}}, Env: []string{"A=1"}, Stdin: []byte("in"), TimeoutMS: 1, KeepSandbox: true}
			return roundTrip(t, v, runRequestToProto, runRequestFromProto, func() *pb.RunRequest { return &pb.RunRequest{} }), v
		}},
		{"run response", func(t *testing.T) (any, any) {
			v := &RunResponse{ExecResponse: ExecResponse{Stdout: "4\n", ExitCode: ptr(0), Success: true}, SandboxID: sid}
			return roundTrip(t, v, runResponseToProto, runResponseFromProto, func() *pb.RunResponse { return &pb.RunResponse{} }), v
		}},
		{"list response", func(t *testing.T) (any, any) {
			v := &ListResponse{Sandboxes: []ListEntry{{SandboxID: sid, Name: "n", Image: "p", AgeSecs: 9, ExecInProgress: true, ExecInFlight: 2, ExecSlotsFree: 2, Stopped: true}}}
			return roundTrip(t, v, listResponseToProto, listResponseFromProto, func() *pb.ListResponse { return &pb.ListResponse{} }), v
		}},
		{"stop request", func(t *testing.T) (any, any) {
			v := &StopRequest{SandboxID: sid, Wait: true}
			return roundTrip(t, v, stopRequestToProto, stopRequestFromProto, func() *pb.StopRequest { return &pb.StopRequest{} }), v
		}},
		{"stop response", func(t *testing.T) (any, any) {
			v := &StopResponse{SandboxID: sid, Stopped: true}
			return roundTrip(t, v, stopResponseToProto, stopResponseFromProto, func() *pb.StopResponse { return &pb.StopResponse{} }), v
		}},
		{"catalog", func(t *testing.T) (any, any) {
			v := &CatalogListResponse{Images: []CatalogImage{{"python", "docker.io/iiidev/python:latest", KindPreset}}}
			return roundTrip(t, v, catalogListResponseToProto, catalogListResponseFromProto, func() *pb.CatalogListResponse { return &pb.CatalogListResponse{} }), v
		}},
		{"ls request", func(t *testing.T) (any, any) {
			v := &FsLsRequest{SandboxID: sid, Path: "/"}
			return roundTrip(t, v, fsLsRequestToProto, fsLsRequestFromProto, func() *pb.FsLsRequest { return &pb.FsLsRequest{} }), v
		}},
		{"ls response", func(t *testing.T) (any, any) {
			v := &FsLsResponse{Entries: []FsEntry{{Name: "a", IsDir: true, Size: 1, Mode: 0o7777, Mtime: -5, IsSymlink: true}}}
			return roundTrip(t, v, fsLsResponseToProto, fsLsResponseFromProto, func() *pb.FsLsResponse { return &pb.FsLsResponse{} }), v
		}},
		{"stat request", func(t *testing.T) (any, any) {
			v := &FsStatRequest{SandboxID: sid, Path: "/a"}
			return roundTrip(t, v, fsStatRequestToProto, fsStatRequestFromProto, func() *pb.FsStatRequest { return &pb.FsStatRequest{} }), v
		}},
		{"stat response", func(t *testing.T) (any, any) {
			v := &FsEntry{Name: "a", Size: 3, Mode: 0o644, Mtime: 1}
			return roundTrip(t, v, fsStatResponseToProto, fsStatResponseFromProto, func() *pb.FsStatResponse { return &pb.FsStatResponse{} }), v
		}},
		{"mkdir request", func(t *testing.T) (any, any) {
			v := &FsMkdirRequest{SandboxID: sid, Path: "/a", Mode: 0o700, Parents: true}
			return roundTrip(t, v, fsMkdirRequestToProto, fsMkdirRequestFromProto, func() *pb.FsMkdirRequest { return &pb.FsMkdirRequest{} }), v
		}},
		{"mkdir response", func(t *testing.T) (any, any) {
			v := &FsMkdirResponse{Created: true}
			return roundTrip(t, v, fsMkdirResponseToProto, fsMkdirResponseFromProto, func() *pb.FsMkdirResponse { return &pb.FsMkdirResponse{} }), v
		}},
		{"write header", func(t *testing.T) (any, any) {
			v := &FsWriteRequest{SandboxID: sid, Path: "/a", Mode: 0o600, Parents: true}
			return roundTrip(t, v, fsWriteHeaderToProto, fsWriteHeaderFromProto, func() *pb.FsWriteHeader { return &pb.FsWriteHeader{} }), v
		}},
		{"write response", func(t *testing.T) (any, any) {
			v := &FsWriteResponse{BytesWritten: 1 << 40, Path: "/a"}
			return roundTrip(t, v, fsWriteResponseToProto, fsWriteResponseFromProto, func() *pb.FsWriteResponse { return &pb.FsWriteResponse{} }), v
		}},
		{"read request", func(t *testing.T) (any, any) {
			v := &FsReadRequest{SandboxID: sid, Path: "/a"}
			return roundTrip(t, v, fsReadRequestToProto, fsReadRequestFromProto, func() *pb.FsReadRequest { return &pb.FsReadRequest{} }), v
		}},
		{"read meta", func(t *testing.T) (any, any) {
			v := &FsReadMeta{Size: 7, Mode: 0o640, Mtime: 1700000000}
			return roundTrip(t, v, fsReadMetaToProto, fsReadMetaFromProto, func() *pb.FsReadMeta { return &pb.FsReadMeta{} }), v
		}},
		{"rm request", func(t *testing.T) (any, any) {
			v := &FsRmRequest{SandboxID: sid, Path: "/a", Recursive: true}
			return roundTrip(t, v, fsRmRequestToProto, fsRmRequestFromProto, func() *pb.FsRmRequest { return &pb.FsRmRequest{} }), v
		}},
		{"rm response", func(t *testing.T) (any, any) {
			v := &FsRmResponse{Removed: true}
			return roundTrip(t, v, fsRmResponseToProto, fsRmResponseFromProto, func() *pb.FsRmResponse { return &pb.FsRmResponse{} }), v
		}},
		{"chmod request with root owner", func(t *testing.T) (any, any) {
			v := &FsChmodRequest{SandboxID: sid, Path: "/a", Mode: 0o4755, UID: ptr(uint32(0)), GID: ptr(uint32(7)), Recursive: true}
			return roundTrip(t, v, fsChmodRequestToProto, fsChmodRequestFromProto, func() *pb.FsChmodRequest { return &pb.FsChmodRequest{} }), v
		}},
		{"chmod request owner unchanged", func(t *testing.T) (any, any) {
			v := &FsChmodRequest{SandboxID: sid, Path: "/a", Mode: 0o644}
			return roundTrip(t, v, fsChmodRequestToProto, fsChmodRequestFromProto, func() *pb.FsChmodRequest { return &pb.FsChmodRequest{} }), v
		}},
		{"chmod response", func(t *testing.T) (any, any) {
			v := &FsChmodResponse{Updated: 4}
			return roundTrip(t, v, fsChmodResponseToProto, fsChmodResponseFromProto, func() *pb.FsChmodResponse { return &pb.FsChmodResponse{} }), v
		}},
		{"mv request", func(t *testing.T) (any, any) {
			v := &FsMvRequest{SandboxID: sid, Src: "/a", Dst: "/b", Overwrite: true}
			return roundTrip(t, v, fsMvRequestToProto, fsMvRequestFromProto, func() *pb.FsMvRequest { return &pb.FsMvRequest{} }), v
		}},
		{"mv response", func(t *testing.T) (any, any) {
			v := &FsMvResponse{Moved: true}
			return roundTrip(t, v, fsMvResponseToProto, fsMvResponseFromProto, func() *pb.FsMvResponse { return &pb.FsMvResponse{} }), v
		}},
		{"grep request", func(t *testing.T) (any, any) {
			v := &FsGrepRequest{SandboxID: sid, Path: "/", Pattern: "x", Recursive: true, IgnoreCase: true, IncludeGlob: []string{"*.py"}, ExcludeGlob: []string{"a"}, MaxMatches: 1, MaxLineBytes: 2}
			return roundTrip(t, v, fsGrepRequestToProto, fsGrepRequestFromProto, func() *pb.FsGrepRequest { return &pb.FsGrepRequest{} }), v
		}},
		{"grep response", func(t *testing.T) (any, any) {
			v := &FsGrepResponse{Matches: []GrepMatch{{Path: "/a", Line: 3, Content: "x…"}}, Truncated: true}
			return roundTrip(t, v, fsGrepResponseToProto, fsGrepResponseFromProto, func() *pb.FsGrepResponse { return &pb.FsGrepResponse{} }), v
		}},
		{"sed request", func(t *testing.T) (any, any) {
			v := &FsSedRequest{SandboxID: sid, Files: []string{"/a"}, Path: "", Recursive: true, Pattern: "p", Replacement: "r", Regex: true, FirstOnly: true, IgnoreCase: true}
			return roundTrip(t, v, fsSedRequestToProto, fsSedRequestFromProto, func() *pb.FsSedRequest { return &pb.FsSedRequest{} }), v
		}},
		{"progress event", func(t *testing.T) (any, any) {
			v := ptr(ProgressEvent{Phase: ProgressPulling, Image: "p", ImageRef: "r", SandboxID: sid}.WithBytes(0, 9))
			from := func(p *pb.ProgressEvent) *ProgressEvent { return ptr(progressEventFromProto(p)) }
			to := func(ev *ProgressEvent) *pb.ProgressEvent { return progressEventToProto(*ev) }
			return roundTrip(t, v, to, from, func() *pb.ProgressEvent { return &pb.ProgressEvent{} }), v
		}},
		{"progress event without bytes", func(t *testing.T) (any, any) {
			v := &ProgressEvent{Phase: ProgressBooting, Image: "p", ImageRef: "r"}
			from := func(p *pb.ProgressEvent) *ProgressEvent { return ptr(progressEventFromProto(p)) }
			to := func(ev *ProgressEvent) *pb.ProgressEvent { return progressEventToProto(*ev) }
			return roundTrip(t, v, to, from, func() *pb.ProgressEvent { return &pb.ProgressEvent{} }), v
		}},
		{"sed response", func(t *testing.T) (any, any) {
			v := &FsSedResponse{Results: []SedResult{{Path: "/a", Replacements: 2, Success: true}, {Path: "/b", Error: "e"}}, TotalReplacements: 2}
			return roundTrip(t, v, fsSedResponseToProto, fsSedResponseFromProto, func() *pb.FsSedResponse { return &pb.FsSedResponse{} }), v
		}},
	}
	// Cases that set every field, so a field a converter forgets shows up.
	full := map[string]bool{}
	for _, n := range []string{"error with fix", "info", "create request", "create response", "exec request", "exec response keeps binary output", "run request", "run response", "list response", "stop request", "stop response", "catalog", "ls request", "ls response", "stat request", "mkdir request", "mkdir response", "write header", "write response", "read request", "read meta", "rm request", "rm response", "chmod request with root owner", "chmod response", "mv request", "mv response", "grep request", "grep response", "sed response", "progress event"} {
		full[n] = true
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, want := tc.run(t)
			assert.DeepEqual(t, got, want)
			if full[tc.name] {
				assertEveryFieldSet(t, want)
			}
		})
	}
}

// assertEveryFieldSet fails when a field of the struct v points to is zero.
func assertEveryFieldSet(t *testing.T, v any) {
	t.Helper()
	rv := reflect.ValueOf(v).Elem()
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Type().Field(i)
		switch {
		case f.Name == "Success",
			f.Name == "Path" && rv.Type() == reflect.TypeOf(FsSedRequest{}),
			f.Name == "Content" && rv.Type() == reflect.TypeOf(FsWriteRequest{}),
			f.Name == "Progress" && (rv.Type() == reflect.TypeOf(CreateRequest{}) || rv.Type() == reflect.TypeOf(RunRequest{})):
			// false in a failed exec, exclusive with Files, or streamed
			// apart (fs::write's content, the progress channel the host
			// bridges into CreateStream and RunStream).
			continue
		}
		assert.Assert(t, !rv.Field(i).IsZero(), "%s.%s is zero in the full sample", rv.Type().Name(), f.Name)
	}
}

// TestConvertInvalidUTF8 checks that strings from inside a sandbox that are
// not UTF-8 still cross the wire, byte for byte replaced as JSON would.
func TestConvertInvalidUTF8(t *testing.T) {
	v := &FsGrepResponse{Matches: []GrepMatch{{Path: "/caf\xe9", Line: 1, Content: "cut mid-rune \xe2\x82"}}}
	got := roundTrip(t, v, fsGrepResponseToProto, fsGrepResponseFromProto, func() *pb.FsGrepResponse { return &pb.FsGrepResponse{} })
	assert.DeepEqual(t, got, &FsGrepResponse{Matches: []GrepMatch{{Path: "/caf\uFFFD", Line: 1, Content: "cut mid-rune \uFFFD\uFFFD"}}})

	e := NewError(S216, "read /\xff failed")
	back := roundTrip(t, e, errorToProto, errorFromProto, func() *pb.SandboxError { return &pb.SandboxError{} })
	assert.Equal(t, back.Message, "read /\uFFFD failed")
}

func TestConvertNilProto(t *testing.T) {
	// A zero or missing message converts to the zero request, not a panic.
	assert.DeepEqual(t, execResponseFromProto(nil), &ExecResponse{})
	assert.DeepEqual(t, runResponseFromProto(&pb.RunResponse{}), &RunResponse{})
	assert.DeepEqual(t, fsStatResponseFromProto(&pb.FsStatResponse{}), &FsEntry{})
	assert.DeepEqual(t, infoFromProto(&pb.InfoResponse{FactsJson: []byte("not json")}), &AdapterInfo{})
	assert.DeepEqual(t, errorFromProto(&pb.SandboxError{Code: "S001", FixJson: []byte("[")}), &Error{Code: S001}, cmpopts.EquateEmpty())
}
