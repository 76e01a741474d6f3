package contract

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hashicorp/go-plugin"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wire connects a GRPCClient to impl through go-plugin's in-process gRPC
// pair, so every call crosses the real proto encoding and gRPC transport.
func wire(t *testing.T, impl Adapter) Adapter {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, VersionedPlugins(impl)[Major])
	// Close asks the server to shut down through go-plugin's controller
	// service; stopping the server here as well would race with that.
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense(PluginName)
	assert.NilError(t, err)
	a, ok := raw.(Adapter)
	assert.Assert(t, ok, "dispensed %T, not an Adapter", raw)
	return a
}

// sandboxErr asserts err is a sandbox error of code and returns it.
func sandboxErr(t *testing.T, err error, code Code) *Error {
	t.Helper()
	var e *Error
	assert.Assert(t, errors.As(err, &e), "want a sandbox error %s, got %T: %v", code, err, err)
	assert.Equal(t, e.Code, code, "message: %s", e.Message)
	info, ok := LookupCode(code)
	assert.Assert(t, ok)
	assert.Equal(t, e.Type, info.Type)
	assert.Equal(t, e.Retryable, info.Retryable)
	assert.Equal(t, e.DocsURL, DocsURL(code))
	return e
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n]
}

func TestWireEveryOperation(t *testing.T) {
	ctx := context.Background()
	mem := newMemAdapter()
	a := wire(t, mem)

	t.Run("info", func(t *testing.T) {
		info, err := a.Info(ctx)
		assert.NilError(t, err)
		want, _ := mem.Info(ctx)
		assert.DeepEqual(t, info, want)
	})

	t.Run("configure", func(t *testing.T) {
		assert.NilError(t, a.Configure(ctx, []byte(`{"image_allowlist":["python","node"]}`)))

		err := a.Configure(ctx, []byte(`[1,2]`))
		var rej *ConfigRejectedError
		assert.Assert(t, errors.As(err, &rej), "got %T %v", err, err)
		assert.Assert(t, is.Contains(rej.Reason, "config is not a JSON object"))
		assert.Assert(t, rej.Err == nil)

		err = a.Configure(ctx, []byte(`{"image_allowlist":[""]}`))
		assert.Assert(t, errors.As(err, &rej), "got %T %v", err, err)
		assert.Assert(t, is.Contains(rej.Reason, "empty name"))
		sandboxErr(t, rej.Err, S100)
	})

	var id string
	t.Run("create", func(t *testing.T) {
		cpus := uint32(2)
		out, err := a.Create(ctx, &CreateRequest{Image: "python", CPUs: &cpus, Name: "w", Env: []string{"A=1"}})
		assert.NilError(t, err)
		assert.Equal(t, out.Image, "python")
		id = out.SandboxID

		_, err = a.Create(ctx, &CreateRequest{Image: "ruby"})
		e := sandboxErr(t, err, S100)
		assert.Assert(t, is.Contains(e.Message, "python, node"))
	})

	t.Run("exec", func(t *testing.T) {
		zero, three := 0, 3
		cases := []struct {
			name  string
			req   ExecRequest
			want  ExecResponse
			code  Code
			inMsg string
		}{
			{name: "echo", req: ExecRequest{Argv: []string{"echo", "a", "b"}},
				want: ExecResponse{Stdout: "a b\n", ExitCode: &zero, Success: true, DurationMS: 1}},
			{name: "stdin", req: ExecRequest{Argv: []string{"cat"}, Stdin: []byte("in\x00\xffput")},
				want: ExecResponse{Stdout: "in\x00\xffput", ExitCode: &zero, Success: true, DurationMS: 1}},
			{name: "env", req: ExecRequest{Argv: []string{"env"}, Env: []string{"A=1", "B=2"}},
				want: ExecResponse{Stdout: "A=1\nB=2", ExitCode: &zero, Success: true, DurationMS: 1}},
			{name: "non-zero exit", req: ExecRequest{Argv: []string{"fail"}},
				want: ExecResponse{Stderr: "failed on purpose\n", ExitCode: &three, DurationMS: 1}},
			{name: "no exit code", req: ExecRequest{Argv: []string{"killed"}},
				want: ExecResponse{DurationMS: 1}},
			{name: "timeout", req: ExecRequest{Argv: []string{"slow"}}, code: S200, inMsg: "timed out"},
			{name: "plain error becomes S300", req: ExecRequest{Argv: []string{"crash"}}, code: S300, inMsg: "guest agent went away"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				tc.req.SandboxID = id
				tc.req.TimeoutMS = DefaultExecTimeoutMS
				out, err := a.Exec(ctx, &tc.req)
				if tc.code != "" {
					e := sandboxErr(t, err, tc.code)
					assert.Assert(t, is.Contains(e.Message, tc.inMsg))
					return
				}
				assert.NilError(t, err)
				assert.DeepEqual(t, *out, tc.want)
			})
		}

		out, err := a.Exec(ctx, &ExecRequest{SandboxID: id, Argv: []string{"flood"}})
		assert.NilError(t, err)
		assert.Equal(t, len(out.Stdout), ExecOutputCap)
		assert.Assert(t, out.StdoutTruncated && !out.StderrTruncated)

		_, err = a.Exec(ctx, &ExecRequest{SandboxID: "00000000-0000-4000-8000-000000000000", Argv: []string{"echo"}})
		sandboxErr(t, err, S002)
	})

	t.Run("mkdir with the parents fix", func(t *testing.T) {
		_, err := a.FsMkdir(ctx, &FsMkdirRequest{SandboxID: id, Path: "/work/a/b", Mode: 0o700})
		e := sandboxErr(t, err, S211)
		assert.DeepEqual(t, e.Fix, map[string]any{"parents": true})
		assert.Assert(t, is.Contains(e.FixNote, "merge `fix`"))

		out, err := a.FsMkdir(ctx, &FsMkdirRequest{SandboxID: id, Path: "/work/a/b", Mode: 0o700, Parents: true})
		assert.NilError(t, err)
		assert.Assert(t, out.Created)
	})

	big := randomBytes(5<<20+12345, 1)
	t.Run("write and read several MiB", func(t *testing.T) {
		w, err := a.FsWrite(ctx, &FsWriteRequest{SandboxID: id, Path: "/work/big.bin", Mode: 0o600}, bytes.NewReader(big))
		assert.NilError(t, err)
		assert.DeepEqual(t, *w, FsWriteResponse{BytesWritten: uint64(len(big)), Path: "/work/big.bin"})

		meta, body, err := a.FsRead(ctx, &FsReadRequest{SandboxID: id, Path: "/work/big.bin"})
		assert.NilError(t, err)
		got, err := io.ReadAll(body)
		assert.NilError(t, err)
		assert.NilError(t, body.Close())
		assert.DeepEqual(t, *meta, FsReadMeta{Size: uint64(len(big)), Mode: 0o600, Mtime: 1_700_000_000})
		assert.Equal(t, sha256.Sum256(got), sha256.Sum256(big))
	})

	t.Run("write small, empty and missing parent", func(t *testing.T) {
		_, err := a.FsWrite(ctx, &FsWriteRequest{SandboxID: id, Path: "/work/main.py", Mode: 0o644}, strings.NewReader("print(1)\nprint(2)\n"))
		assert.NilError(t, err)
		w, err := a.FsWrite(ctx, &FsWriteRequest{SandboxID: id, Path: "/work/empty", Mode: 0o644}, nil)
		assert.NilError(t, err)
		assert.Equal(t, w.BytesWritten, uint64(0))

		_, err = a.FsWrite(ctx, &FsWriteRequest{SandboxID: id, Path: "/nope/x", Mode: 0o644}, strings.NewReader("x"))
		e := sandboxErr(t, err, S211)
		assert.DeepEqual(t, e.Fix, ParentsFix())
	})

	t.Run("adapter refuses a write before reading it", func(t *testing.T) {
		// The adapter fails at once; the client is still sending MiBs.
		_, err := a.FsWrite(ctx, &FsWriteRequest{SandboxID: "00000000-0000-4000-8000-000000000001", Path: "/x"}, bytes.NewReader(big))
		sandboxErr(t, err, S002)
	})

	t.Run("content source breaks mid-write", func(t *testing.T) {
		src := &failingReader{data: big[:3*ChunkSize+7], err: errors.New("channel closed by peer")}
		_, err := a.FsWrite(ctx, &FsWriteRequest{SandboxID: id, Path: "/work/partial", Mode: 0o644}, src)
		e := sandboxErr(t, err, S218)
		assert.Assert(t, is.Contains(e.Message, "channel closed by peer"))
		_, err = a.FsStat(ctx, &FsStatRequest{SandboxID: id, Path: "/work/partial"})
		sandboxErr(t, err, S211)
	})

	t.Run("a chunk source's chunks go as they are", func(t *testing.T) {
		// Uneven chunks, none over ChunkSize: the bytes arrive in order;
		// Read is never called.
		src := &chunkSource{data: big, sizes: []int{ChunkSize, 1, ChunkSize / 2, ChunkSize - 3, 7}}
		w, err := a.FsWrite(ctx, &FsWriteRequest{SandboxID: id, Path: "/work/a/chunks.bin", Mode: 0o600}, src)
		assert.NilError(t, err)
		assert.Equal(t, w.BytesWritten, uint64(len(big)))
		assert.Assert(t, src.chunks > len(big)/ChunkSize, "%d chunks", src.chunks)
		_, body, err := a.FsRead(ctx, &FsReadRequest{SandboxID: id, Path: "/work/a/chunks.bin"})
		assert.NilError(t, err)
		got, err := io.ReadAll(body)
		assert.NilError(t, err)
		assert.NilError(t, body.Close())
		assert.Equal(t, sha256.Sum256(got), sha256.Sum256(big))

		broken := &chunkSource{data: big[:2*ChunkSize+5], sizes: []int{ChunkSize}, err: errors.New("channel closed by peer")}
		_, err = a.FsWrite(ctx, &FsWriteRequest{SandboxID: id, Path: "/work/partial", Mode: 0o644}, broken)
		e := sandboxErr(t, err, S218)
		assert.Assert(t, is.Contains(e.Message, "channel closed by peer"))
		_, err = a.FsStat(ctx, &FsStatRequest{SandboxID: id, Path: "/work/partial"})
		sandboxErr(t, err, S211)
	})

	t.Run("read errors", func(t *testing.T) {
		_, _, err := a.FsRead(ctx, &FsReadRequest{SandboxID: id, Path: "/work"})
		sandboxErr(t, err, S212)
		_, _, err = a.FsRead(ctx, &FsReadRequest{SandboxID: id, Path: "/missing"})
		sandboxErr(t, err, S211)
	})

	t.Run("ls and stat", func(t *testing.T) {
		ls, err := a.FsLs(ctx, &FsLsRequest{SandboxID: id, Path: "/work"})
		assert.NilError(t, err)
		var names []string
		for _, e := range ls.Entries {
			names = append(names, e.Name)
		}
		assert.DeepEqual(t, names, []string{"a", "big.bin", "empty", "main.py"})

		st, err := a.FsStat(ctx, &FsStatRequest{SandboxID: id, Path: "/work/main.py"})
		assert.NilError(t, err)
		assert.DeepEqual(t, *st, FsEntry{Name: "main.py", Size: 18, Mode: 0o644, Mtime: 1_700_000_000})
	})

	t.Run("chmod", func(t *testing.T) {
		out, err := a.FsChmod(ctx, &FsChmodRequest{SandboxID: id, Path: "/work/main.py", Mode: 0o4755})
		assert.NilError(t, err)
		assert.Equal(t, out.Updated, uint64(1))
		st, err := a.FsStat(ctx, &FsStatRequest{SandboxID: id, Path: "/work/main.py"})
		assert.NilError(t, err)
		assert.Equal(t, st.Mode.String(), "4755")

		uid := uint32(1000)
		_, err = a.FsChmod(ctx, &FsChmodRequest{SandboxID: id, Path: "/work/main.py", Mode: 0o644, UID: &uid})
		sandboxErr(t, err, S215)
	})

	t.Run("grep and sed", func(t *testing.T) {
		g, err := a.FsGrep(ctx, &FsGrepRequest{SandboxID: id, Path: "/work", Pattern: `PRINT\(2`, IgnoreCase: true, MaxMatches: 10})
		assert.NilError(t, err)
		assert.DeepEqual(t, *g, FsGrepResponse{Matches: []GrepMatch{{Path: "/work/main.py", Line: 2, Content: "print(2)"}}})

		g, err = a.FsGrep(ctx, &FsGrepRequest{SandboxID: id, Path: "/work/main.py", Pattern: `print`, MaxMatches: 1})
		assert.NilError(t, err)
		assert.Assert(t, g.Truncated && len(g.Matches) == 1)

		s, err := a.FsSed(ctx, &FsSedRequest{SandboxID: id, Files: []string{"/work/main.py", "/work/gone"}, Pattern: "print", Replacement: "echo", Regex: true})
		assert.NilError(t, err)
		assert.DeepEqual(t, *s, FsSedResponse{
			Results:           []SedResult{{Path: "/work/main.py", Replacements: 2, Success: true}, {Path: "/work/gone", Error: "file not found"}},
			TotalReplacements: 2,
		})
	})

	t.Run("mv and rm", func(t *testing.T) {
		_, err := a.FsMv(ctx, &FsMvRequest{SandboxID: id, Src: "/work/main.py", Dst: "/work/empty"})
		sandboxErr(t, err, S213)
		mv, err := a.FsMv(ctx, &FsMvRequest{SandboxID: id, Src: "/work/main.py", Dst: "/work/empty", Overwrite: true})
		assert.NilError(t, err)
		assert.Assert(t, mv.Moved)

		_, err = a.FsRm(ctx, &FsRmRequest{SandboxID: id, Path: "/work/a"})
		sandboxErr(t, err, S214)
		rm, err := a.FsRm(ctx, &FsRmRequest{SandboxID: id, Path: "/work/a", Recursive: true})
		assert.NilError(t, err)
		assert.Assert(t, rm.Removed)
	})

	t.Run("list and catalog", func(t *testing.T) {
		l, err := a.List(ctx, &ListRequest{})
		assert.NilError(t, err)
		assert.DeepEqual(t, l.Sandboxes, []ListEntry{{SandboxID: id, Name: "w", Image: "python", ExecSlotsFree: 4}})

		c, err := a.CatalogList(ctx, &CatalogListRequest{})
		assert.NilError(t, err)
		assert.Equal(t, len(c.Images), 2)
		assert.Equal(t, c.Images[0], CatalogImage{Name: "python", OCIRef: "docker.io/iiidev/python:latest", Kind: KindPreset})
	})

	t.Run("run", func(t *testing.T) {
		out, err := a.Run(ctx, &RunRequest{Image: "python", Code: "print(2+2)", Lang: "python", KeepSandbox: true,
			Files: []RunFile{{Path: "/work/lib.py", Content: "x = 1"}}})
		assert.NilError(t, err)
		assert.Equal(t, out.Stdout, "print(2+2)")
		assert.Assert(t, out.Success && out.SandboxID != "")

		out, err = a.Run(ctx, &RunRequest{Image: "python", Code: "x", Lang: "python"})
		assert.NilError(t, err)
		assert.Equal(t, out.SandboxID, "")

		_, err = a.Run(ctx, &RunRequest{Image: "node", Code: "x", Lang: "slow", KeepSandbox: true})
		e := sandboxErr(t, err, S200)
		assert.Equal(t, e.Fix["context"], "during sandbox::run step `exec`")
		assert.Equal(t, e.Fix["inner_code"], "S200")
		assert.Assert(t, e.Fix["sandbox_id"] != "")

		_, err = a.Run(ctx, &RunRequest{Image: "ruby", Code: "x", Lang: "ruby"})
		e = sandboxErr(t, err, S100)
		assert.DeepEqual(t, e.Fix, map[string]any{"context": "during sandbox::run step `create`", "sandbox_id": "", "inner_code": "S100"})
	})

	t.Run("stop", func(t *testing.T) {
		out, err := a.Stop(ctx, &StopRequest{SandboxID: id, Wait: true})
		assert.NilError(t, err)
		assert.DeepEqual(t, *out, StopResponse{SandboxID: id, Stopped: true})
		_, err = a.Exec(ctx, &ExecRequest{SandboxID: id, Argv: []string{"echo"}})
		sandboxErr(t, err, S004)
		_, err = a.FsLs(ctx, &FsLsRequest{SandboxID: id, Path: "/"})
		sandboxErr(t, err, S004)
	})
}

func TestWireReadFailsMidStream(t *testing.T) {
	ctx := context.Background()
	mem := newMemAdapter()
	mem.readFailAfter = 200 << 10
	a := wire(t, mem)

	sb, err := a.Create(ctx, &CreateRequest{Image: "node"})
	assert.NilError(t, err)
	data := randomBytes(1<<20, 2)
	_, err = a.FsWrite(ctx, &FsWriteRequest{SandboxID: sb.SandboxID, Path: "/f"}, bytes.NewReader(data))
	assert.NilError(t, err)

	meta, body, err := a.FsRead(ctx, &FsReadRequest{SandboxID: sb.SandboxID, Path: "/f"})
	assert.NilError(t, err)
	defer body.Close()
	assert.Equal(t, meta.Size, uint64(len(data)))
	got, err := io.ReadAll(body)
	e := sandboxErr(t, err, S216)
	assert.Assert(t, is.Contains(e.Message, "disk read failed"))
	assert.Assert(t, bytes.Equal(got, data[:len(got)]), "the bytes before the failure arrive intact")
	assert.Assert(t, len(got) <= mem.readFailAfter)
}

func TestWireCancelledCall(t *testing.T) {
	mem := newMemAdapter()
	a := wire(t, mem)
	sb, err := a.Create(context.Background(), &CreateRequest{Image: "node"})
	assert.NilError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, &ExecRequest{SandboxID: sb.SandboxID, Argv: []string{"hang"}})
		done <- err
	}()
	cancel()
	err = waitfor.Recv(t, done, waitfor.Default, "the cancelled Exec to return")
	assert.Assert(t, errors.Is(err, context.Canceled), "got %T %v", err, err)
	var e *Error
	assert.Assert(t, !errors.As(err, &e), "a cancelled call is not a sandbox error")
}

func TestWireAdapterGone(t *testing.T) {
	client, server := plugin.TestPluginGRPCConn(t, false, VersionedPlugins(newMemAdapter())[Major])
	raw, err := client.Dispense(PluginName)
	assert.NilError(t, err)
	a := raw.(Adapter)
	server.Stop()
	defer client.Close()

	_, err = a.List(context.Background(), &ListRequest{})
	assert.Assert(t, err != nil)
	var e *Error
	assert.Assert(t, !errors.As(err, &e), "a transport failure is not a sandbox error: %v", err)
	assert.Assert(t, is.Contains(err.Error(), "sandbox adapter list"))
}

func TestPluginGlue(t *testing.T) {
	h := Handshake()
	assert.Equal(t, h.ProtocolVersion, uint(1))
	assert.Equal(t, h.MagicCookieKey, "III_SANDBOX_ADAPTER")
	assert.Equal(t, len(h.MagicCookieValue), 64)
	for _, c := range h.MagicCookieValue {
		assert.Assert(t, strings.ContainsRune("0123456789abcdef", c))
	}
	vp := VersionedPlugins(nil)
	assert.Equal(t, len(vp), 1)
	p, ok := vp[Major][PluginName].(*GRPCPlugin)
	assert.Assert(t, ok)
	assert.ErrorContains(t, p.GRPCServer(nil, nil), "no adapter")
}

// chunkSource is a ChunkReader handing out data in chunks of sizes, in
// turn, then err (io.EOF when nil).
type chunkSource struct {
	data   []byte
	sizes  []int
	err    error
	chunks int
}

func (c *chunkSource) Read([]byte) (int, error) {
	return 0, errors.New("Read called on a ChunkReader")
}

func (c *chunkSource) ReadChunk(max int) ([]byte, error) {
	if len(c.data) == 0 {
		if c.err != nil {
			return nil, c.err
		}
		return nil, io.EOF
	}
	n := min(c.sizes[c.chunks%len(c.sizes)], max, len(c.data))
	c.chunks++
	out := c.data[:n:n]
	c.data = c.data[n:]
	return out, nil
}
