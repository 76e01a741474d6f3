package adapterrpc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterrpc"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

const sid = "1b4e6709-f265-4142-9178-3a7d83b46aa5"

func TestMain(m *testing.M) {
	// go-plugin's broker holds the connection info of a service nobody
	// dialled (a test that opened no channel) for five seconds, then
	// drops it: its goroutine, not one of ours.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/go-plugin.(*GRPCBroker).timeoutWait"))
}

// wire connects a Client to impl through go-plugin's in-process gRPC pair,
// so every call crosses the real JSON invoke, the broker's channel service
// and the gRPC transport.
func wire(t *testing.T, impl contract.Adapter) contract.Adapter {
	t.Helper()
	p := &adapterrpc.Plugin{Impl: impl}
	client, _ := plugin.TestPluginGRPCConn(t, false, adapterrpc.VersionedPlugins(p)[contract.Major])
	// Close asks the server to shut down through go-plugin's controller
	// service; stopping the server here as well would race with that.
	t.Cleanup(func() {
		_ = client.Close()
		p.Close()
	})
	raw, err := client.Dispense(contract.PluginName)
	assert.NilError(t, err)
	a, ok := raw.(contract.Adapter)
	assert.Assert(t, ok, "dispensed %T, not an Adapter", raw)
	return a
}

// sandboxErr asserts err is a sandbox error of code and returns it.
func sandboxErr(t *testing.T, err error, code contract.Code) *contract.Error {
	t.Helper()
	var e *contract.Error
	assert.Assert(t, errors.As(err, &e), "want a sandbox error %s, got %T: %v", code, err, err)
	assert.Equal(t, e.Code, code, "message: %s", e.Message)
	info, ok := contract.LookupCode(code)
	assert.Assert(t, ok)
	assert.Equal(t, e.Type, info.Type)
	assert.Equal(t, e.Retryable, info.Retryable)
	assert.Equal(t, e.DocsURL, contract.DocsURL(code))
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
		var rej *contract.ConfigRejectedError
		assert.Assert(t, errors.As(err, &rej), "got %T %v", err, err)
		assert.Assert(t, is.Contains(rej.Reason, "config is not a JSON object"))
		assert.Assert(t, rej.Err == nil)

		err = a.Configure(ctx, []byte(`{"image_allowlist":[""]}`))
		assert.Assert(t, errors.As(err, &rej), "got %T %v", err, err)
		assert.Assert(t, is.Contains(rej.Reason, "empty name"))
		sandboxErr(t, rej.Err, contract.S100)
	})

	var id string
	t.Run("create", func(t *testing.T) {
		cpus := uint32(2)
		out, err := a.Create(ctx, &contract.CreateRequest{Image: "python", CPUs: &cpus, Name: "w", Env: []string{"A=1"}})
		assert.NilError(t, err)
		assert.Equal(t, out.Image, "python")
		id = out.SandboxID

		_, err = a.Create(ctx, &contract.CreateRequest{Image: "ruby"})
		e := sandboxErr(t, err, contract.S100)
		assert.Assert(t, is.Contains(e.Message, "python, node"))
	})

	t.Run("exec", func(t *testing.T) {
		zero, three := 0, 3
		cases := []struct {
			name  string
			req   contract.ExecRequest
			want  contract.ExecResponse
			code  contract.Code
			inMsg string
		}{
			{name: "echo", req: contract.ExecRequest{Argv: []string{"echo", "a", "b"}},
				want: contract.ExecResponse{Stdout: "a b\n", ExitCode: &zero, Success: true, DurationMS: 1}},
			{name: "stdin", req: contract.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("in\x00\xffput")},
				// stdout is a JSON string: bytes that are not UTF-8
				// arrive as U+FFFD, as every caller of the engine sees.
				want: contract.ExecResponse{Stdout: "in\x00\uFFFDput", ExitCode: &zero, Success: true, DurationMS: 1}},
			{name: "env", req: contract.ExecRequest{Argv: []string{"env"}, Env: []string{"A=1", "B=2"}},
				want: contract.ExecResponse{Stdout: "A=1\nB=2", ExitCode: &zero, Success: true, DurationMS: 1}},
			{name: "non-zero exit", req: contract.ExecRequest{Argv: []string{"fail"}},
				want: contract.ExecResponse{Stderr: "failed on purpose\n", ExitCode: &three, DurationMS: 1}},
			{name: "no exit code", req: contract.ExecRequest{Argv: []string{"killed"}},
				want: contract.ExecResponse{DurationMS: 1}},
			{name: "timeout", req: contract.ExecRequest{Argv: []string{"slow"}}, code: contract.S200, inMsg: "timed out"},
			{name: "plain error becomes S300", req: contract.ExecRequest{Argv: []string{"crash"}}, code: contract.S300, inMsg: "guest agent went away"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				tc.req.SandboxID = id
				tc.req.TimeoutMS = contract.DefaultExecTimeoutMS
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

		out, err := a.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"flood"}})
		assert.NilError(t, err)
		assert.Equal(t, len(out.Stdout), contract.ExecOutputCap)
		assert.Assert(t, out.StdoutTruncated && !out.StderrTruncated)

		_, err = a.Exec(ctx, &contract.ExecRequest{SandboxID: "00000000-0000-4000-8000-000000000000", Argv: []string{"echo"}})
		sandboxErr(t, err, contract.S002)
	})

	t.Run("mkdir with the parents fix", func(t *testing.T) {
		_, err := a.FsMkdir(ctx, &contract.FsMkdirRequest{SandboxID: id, Path: "/work/a/b", Mode: 0o700})
		e := sandboxErr(t, err, contract.S211)
		assert.DeepEqual(t, e.Fix, map[string]any{"parents": true})
		assert.Assert(t, is.Contains(e.FixNote, "merge `fix`"))

		out, err := a.FsMkdir(ctx, &contract.FsMkdirRequest{SandboxID: id, Path: "/work/a/b", Mode: 0o700, Parents: true})
		assert.NilError(t, err)
		assert.Assert(t, out.Created)
	})

	big := randomBytes(5<<20+12345, 1)
	t.Run("write and read several MiB", func(t *testing.T) {
		w, err := a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/work/big.bin", Mode: 0o600}, bytes.NewReader(big))
		assert.NilError(t, err)
		assert.DeepEqual(t, *w, contract.FsWriteResponse{BytesWritten: uint64(len(big)), Path: "/work/big.bin"})

		meta, body, err := a.FsRead(ctx, &contract.FsReadRequest{SandboxID: id, Path: "/work/big.bin"})
		assert.NilError(t, err)
		got, err := io.ReadAll(body)
		assert.NilError(t, err)
		assert.NilError(t, body.Close())
		assert.DeepEqual(t, *meta, contract.FsReadMeta{Size: uint64(len(big)), Mode: 0o600, Mtime: 1_700_000_000})
		assert.Equal(t, sha256.Sum256(got), sha256.Sum256(big))
	})

	t.Run("write small, empty and missing parent", func(t *testing.T) {
		_, err := a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/work/main.py", Mode: 0o644}, strings.NewReader("print(1)\nprint(2)\n"))
		assert.NilError(t, err)
		w, err := a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/work/empty", Mode: 0o644}, nil)
		assert.NilError(t, err)
		assert.Equal(t, w.BytesWritten, uint64(0))

		_, err = a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/nope/x", Mode: 0o644}, strings.NewReader("x"))
		e := sandboxErr(t, err, contract.S211)
		assert.DeepEqual(t, e.Fix, contract.ParentsFix())
	})

	t.Run("adapter refuses a write before reading it", func(t *testing.T) {
		// The adapter fails at once; the client is still sending MiBs.
		_, err := a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: "00000000-0000-4000-8000-000000000001", Path: "/x"}, bytes.NewReader(big))
		sandboxErr(t, err, contract.S002)
	})

	t.Run("content source breaks mid-write", func(t *testing.T) {
		src := &failingReader{data: big[:3*contract.ChunkSize+7], err: errors.New("channel closed by peer")}
		_, err := a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/work/partial", Mode: 0o644}, src)
		e := sandboxErr(t, err, contract.S218)
		assert.Assert(t, is.Contains(e.Message, "channel closed by peer"))
		_, err = a.FsStat(ctx, &contract.FsStatRequest{SandboxID: id, Path: "/work/partial"})
		sandboxErr(t, err, contract.S211)
	})

	t.Run("a chunk source's chunks go as they are", func(t *testing.T) {
		// Uneven chunks, none over ChunkSize: the bytes arrive in order;
		// Read is never called.
		src := &chunkSource{data: big, sizes: []int{contract.ChunkSize, 1, contract.ChunkSize / 2, contract.ChunkSize - 3, 7}}
		w, err := a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/work/a/chunks.bin", Mode: 0o600}, src)
		assert.NilError(t, err)
		assert.Equal(t, w.BytesWritten, uint64(len(big)))
		assert.Assert(t, src.chunks > len(big)/contract.ChunkSize, "%d chunks", src.chunks)
		_, body, err := a.FsRead(ctx, &contract.FsReadRequest{SandboxID: id, Path: "/work/a/chunks.bin"})
		assert.NilError(t, err)
		got, err := io.ReadAll(body)
		assert.NilError(t, err)
		assert.NilError(t, body.Close())
		assert.Equal(t, sha256.Sum256(got), sha256.Sum256(big))

		broken := &chunkSource{data: big[:2*contract.ChunkSize+5], sizes: []int{contract.ChunkSize}, err: errors.New("channel closed by peer")}
		_, err = a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/work/partial", Mode: 0o644}, broken)
		e := sandboxErr(t, err, contract.S218)
		assert.Assert(t, is.Contains(e.Message, "channel closed by peer"))
		_, err = a.FsStat(ctx, &contract.FsStatRequest{SandboxID: id, Path: "/work/partial"})
		sandboxErr(t, err, contract.S211)
	})

	t.Run("read errors", func(t *testing.T) {
		_, _, err := a.FsRead(ctx, &contract.FsReadRequest{SandboxID: id, Path: "/work"})
		sandboxErr(t, err, contract.S212)
		_, _, err = a.FsRead(ctx, &contract.FsReadRequest{SandboxID: id, Path: "/missing"})
		sandboxErr(t, err, contract.S211)
	})

	t.Run("ls and stat", func(t *testing.T) {
		ls, err := a.FsLs(ctx, &contract.FsLsRequest{SandboxID: id, Path: "/work"})
		assert.NilError(t, err)
		var names []string
		for _, e := range ls.Entries {
			names = append(names, e.Name)
		}
		assert.DeepEqual(t, names, []string{"a", "big.bin", "empty", "main.py"})

		st, err := a.FsStat(ctx, &contract.FsStatRequest{SandboxID: id, Path: "/work/main.py"})
		assert.NilError(t, err)
		assert.DeepEqual(t, *st, contract.FsEntry{Name: "main.py", Size: 18, Mode: 0o644, Mtime: 1_700_000_000})
	})

	t.Run("chmod", func(t *testing.T) {
		out, err := a.FsChmod(ctx, &contract.FsChmodRequest{SandboxID: id, Path: "/work/main.py", Mode: 0o4755})
		assert.NilError(t, err)
		assert.Equal(t, out.Updated, uint64(1))
		st, err := a.FsStat(ctx, &contract.FsStatRequest{SandboxID: id, Path: "/work/main.py"})
		assert.NilError(t, err)
		assert.Equal(t, st.Mode.String(), "4755")

		uid := uint32(1000)
		_, err = a.FsChmod(ctx, &contract.FsChmodRequest{SandboxID: id, Path: "/work/main.py", Mode: 0o644, UID: &uid})
		sandboxErr(t, err, contract.S215)
	})

	t.Run("grep and sed", func(t *testing.T) {
		g, err := a.FsGrep(ctx, &contract.FsGrepRequest{SandboxID: id, Path: "/work", Pattern: `PRINT\(2`, IgnoreCase: true, MaxMatches: 10})
		assert.NilError(t, err)
		assert.DeepEqual(t, *g, contract.FsGrepResponse{Matches: []contract.GrepMatch{{Path: "/work/main.py", Line: 2, Content: "print(2)"}}})

		g, err = a.FsGrep(ctx, &contract.FsGrepRequest{SandboxID: id, Path: "/work/main.py", Pattern: `print`, MaxMatches: 1})
		assert.NilError(t, err)
		assert.Assert(t, g.Truncated && len(g.Matches) == 1)

		s, err := a.FsSed(ctx, &contract.FsSedRequest{SandboxID: id, Files: []string{"/work/main.py", "/work/gone"}, Pattern: "print", Replacement: "echo", Regex: true})
		assert.NilError(t, err)
		assert.DeepEqual(t, *s, contract.FsSedResponse{
			Results:           []contract.SedResult{{Path: "/work/main.py", Replacements: 2, Success: true}, {Path: "/work/gone", Error: "file not found"}},
			TotalReplacements: 2,
		})
	})

	t.Run("mv and rm", func(t *testing.T) {
		_, err := a.FsMv(ctx, &contract.FsMvRequest{SandboxID: id, Src: "/work/main.py", Dst: "/work/empty"})
		sandboxErr(t, err, contract.S213)
		mv, err := a.FsMv(ctx, &contract.FsMvRequest{SandboxID: id, Src: "/work/main.py", Dst: "/work/empty", Overwrite: true})
		assert.NilError(t, err)
		assert.Assert(t, mv.Moved)

		_, err = a.FsRm(ctx, &contract.FsRmRequest{SandboxID: id, Path: "/work/a"})
		sandboxErr(t, err, contract.S214)
		rm, err := a.FsRm(ctx, &contract.FsRmRequest{SandboxID: id, Path: "/work/a", Recursive: true})
		assert.NilError(t, err)
		assert.Assert(t, rm.Removed)
	})

	t.Run("list and catalog", func(t *testing.T) {
		l, err := a.List(ctx, &contract.ListRequest{})
		assert.NilError(t, err)
		assert.DeepEqual(t, l.Sandboxes, []contract.ListEntry{{SandboxID: id, Name: "w", Image: "python", ExecSlotsFree: 4}})

		c, err := a.CatalogList(ctx, &contract.CatalogListRequest{})
		assert.NilError(t, err)
		assert.Equal(t, len(c.Images), 2)
		assert.Equal(t, c.Images[0], contract.CatalogImage{Name: "python", OCIRef: "docker.io/iiidev/python:latest", Kind: contract.KindPreset})
	})

	t.Run("run", func(t *testing.T) {
		out, err := a.Run(ctx, &contract.RunRequest{Image: "python", Code: "print(2+2)", Lang: "python", KeepSandbox: true,
			Files: []contract.RunFile{{Path: "/work/lib.py", Content: "x = 1"}}})
		assert.NilError(t, err)
		assert.Equal(t, out.Stdout, "print(2+2)")
		assert.Assert(t, out.Success && out.SandboxID != "")

		out, err = a.Run(ctx, &contract.RunRequest{Image: "python", Code: "x", Lang: "python"})
		assert.NilError(t, err)
		assert.Equal(t, out.SandboxID, "")

		_, err = a.Run(ctx, &contract.RunRequest{Image: "node", Code: "x", Lang: "slow", KeepSandbox: true})
		e := sandboxErr(t, err, contract.S200)
		assert.Equal(t, e.Fix["context"], "during sandbox::run step `exec`")
		assert.Equal(t, e.Fix["inner_code"], "S200")
		assert.Assert(t, e.Fix["sandbox_id"] != "")

		_, err = a.Run(ctx, &contract.RunRequest{Image: "ruby", Code: "x", Lang: "ruby"})
		e = sandboxErr(t, err, contract.S100)
		assert.DeepEqual(t, e.Fix, map[string]any{"context": "during sandbox::run step `create`", "sandbox_id": "", "inner_code": "S100"})
	})

	t.Run("stop", func(t *testing.T) {
		out, err := a.Stop(ctx, &contract.StopRequest{SandboxID: id, Wait: true})
		assert.NilError(t, err)
		assert.DeepEqual(t, *out, contract.StopResponse{SandboxID: id, Stopped: true})
		_, err = a.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo"}})
		sandboxErr(t, err, contract.S004)
		_, err = a.FsLs(ctx, &contract.FsLsRequest{SandboxID: id, Path: "/"})
		sandboxErr(t, err, contract.S004)
	})
}

func TestWireReadFailsMidStream(t *testing.T) {
	ctx := context.Background()
	mem := newMemAdapter()
	mem.readFailAfter = 200 << 10
	a := wire(t, mem)

	sb, err := a.Create(ctx, &contract.CreateRequest{Image: "node"})
	assert.NilError(t, err)
	data := randomBytes(1<<20, 2)
	_, err = a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: sb.SandboxID, Path: "/f"}, bytes.NewReader(data))
	assert.NilError(t, err)

	meta, body, err := a.FsRead(ctx, &contract.FsReadRequest{SandboxID: sb.SandboxID, Path: "/f"})
	assert.NilError(t, err)
	defer body.Close()
	assert.Equal(t, meta.Size, uint64(len(data)))
	got, err := io.ReadAll(body)
	// The adapter aborts the channel: the reader sees a broken stream,
	// not a short file (the reason is in the adapter's log).
	e := sandboxErr(t, err, contract.S216)
	assert.Assert(t, is.Contains(e.Message, "broke off"))
	assert.Assert(t, bytes.Equal(got, data[:len(got)]), "the bytes before the failure arrive intact")
	assert.Assert(t, len(got) <= mem.readFailAfter)
}

// go-plugin's broker hands the adapter the channel service's address for
// five seconds only. A first fs::read long after the adapter started must
// still reach the channels: the adapter dials at the first call.
func TestWireChannelsLongAfterStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := wire(t, newMemAdapter())
	sb, err := a.Create(ctx, &contract.CreateRequest{Image: "node"})
	assert.NilError(t, err)
	time.Sleep(6 * time.Second) // past the broker's fixed five seconds; no event to wait for
	_, err = a.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: sb.SandboxID, Path: "/late"}, strings.NewReader("late"))
	assert.NilError(t, err)
	_, body, err := a.FsRead(ctx, &contract.FsReadRequest{SandboxID: sb.SandboxID, Path: "/late"})
	assert.NilError(t, err)
	defer body.Close()
	got, err := io.ReadAll(body)
	assert.NilError(t, err)
	assert.Equal(t, string(got), "late")
}

func TestWireCancelledCall(t *testing.T) {
	mem := newMemAdapter()
	a := wire(t, mem)
	sb, err := a.Create(context.Background(), &contract.CreateRequest{Image: "node"})
	assert.NilError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, &contract.ExecRequest{SandboxID: sb.SandboxID, Argv: []string{"hang"}})
		done <- err
	}()
	cancel()
	err = waitfor.Recv(t, done, waitfor.Default, "the cancelled Exec to return")
	assert.Assert(t, errors.Is(err, context.Canceled), "got %T %v", err, err)
	var e *contract.Error
	assert.Assert(t, !errors.As(err, &e), "a cancelled call is not a sandbox error")
}

func TestWireAdapterGone(t *testing.T) {
	p := &adapterrpc.Plugin{Impl: newMemAdapter()}
	defer p.Close()
	client, server := plugin.TestPluginGRPCConn(t, false, adapterrpc.VersionedPlugins(p)[contract.Major])
	raw, err := client.Dispense(contract.PluginName)
	assert.NilError(t, err)
	a := raw.(contract.Adapter)
	server.Stop()
	defer client.Close()

	_, err = a.List(context.Background(), &contract.ListRequest{})
	assert.Assert(t, err != nil)
	var e *contract.Error
	assert.Assert(t, !errors.As(err, &e), "a transport failure is not a sandbox error: %v", err)
	assert.Assert(t, is.Contains(err.Error(), "sandbox adapter list"))
}

func TestPluginGlue(t *testing.T) {
	h := contract.Handshake()
	assert.Equal(t, h.ProtocolVersion, uint(1))
	assert.Equal(t, h.MagicCookieKey, "III_SANDBOX_ADAPTER")
	assert.Equal(t, len(h.MagicCookieValue), 64)
	for _, c := range h.MagicCookieValue {
		assert.Assert(t, strings.ContainsRune("0123456789abcdef", c))
	}
	vp := adapterrpc.VersionedPlugins(&adapterrpc.Plugin{})
	assert.Equal(t, len(vp), 1)
	p, ok := vp[contract.Major][contract.PluginName].(*adapterrpc.Plugin)
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

// progressAdapter reports a fixed progress sequence from Create and Run,
// then answers like memAdapter.
type progressAdapter struct {
	*memAdapter
	events []contract.ProgressEvent
	fail   *contract.Error
}

func (p *progressAdapter) report(ctx context.Context) error {
	for _, ev := range p.events {
		contract.ReportProgress(ctx, ev)
	}
	if p.fail != nil {
		return p.fail
	}
	return nil
}

func (p *progressAdapter) Create(ctx context.Context, req *contract.CreateRequest) (*contract.CreateResponse, error) {
	if err := p.report(ctx); err != nil {
		return nil, err
	}
	return p.memAdapter.Create(ctx, req)
}

func (p *progressAdapter) Run(ctx context.Context, req *contract.RunRequest) (*contract.RunResponse, error) {
	if err := p.report(ctx); err != nil {
		return nil, err
	}
	return p.memAdapter.Run(ctx, req)
}

// collector is a progress sink for tests.
type collector struct {
	mu  sync.Mutex
	evs []contract.ProgressEvent
}

func (c *collector) sink(ev contract.ProgressEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evs = append(c.evs, ev)
}

func (c *collector) events() []contract.ProgressEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]contract.ProgressEvent(nil), c.evs...)
}

// Progress crosses the real gRPC transport: reported events reach the
// host's sink in order before the reply, errors keep their code, and a
// call without a sink stays unary.
func TestWireProgress(t *testing.T) {
	events := []contract.ProgressEvent{
		contract.ProgressEvent{Phase: contract.ProgressPulling, Image: "python", ImageRef: "r"}.WithBytes(0, 0),
		contract.ProgressEvent{Phase: contract.ProgressUnpacking, Image: "python", ImageRef: "r"}.WithBytes(7, 9),
		{Phase: contract.ProgressBooting, Image: "python", ImageRef: "r"},
		{Phase: contract.ProgressReady, Image: "python", ImageRef: "r", SandboxID: sid},
	}
	impl := &progressAdapter{memAdapter: newMemAdapter(), events: events}
	a := wire(t, impl)

	t.Run("create", func(t *testing.T) {
		var c collector
		out, err := a.Create(contract.WithProgress(context.Background(), c.sink), &contract.CreateRequest{Image: "python"})
		assert.NilError(t, err)
		assert.Equal(t, out.Image, "python")
		assert.DeepEqual(t, c.events(), events)
	})
	t.Run("run", func(t *testing.T) {
		var c collector
		out, err := a.Run(contract.WithProgress(context.Background(), c.sink), &contract.RunRequest{Image: "python", Lang: "sh", Code: "echo"})
		assert.NilError(t, err)
		assert.Check(t, out.ExitCode != nil)
		assert.DeepEqual(t, c.events(), events)
	})
	t.Run("without a sink", func(t *testing.T) {
		out, err := a.Create(context.Background(), &contract.CreateRequest{Image: "python"})
		assert.NilError(t, err)
		assert.Check(t, out.SandboxID != "")
	})
	t.Run("an error after progress", func(t *testing.T) {
		failing := &progressAdapter{memAdapter: newMemAdapter(), events: events[:2], fail: contract.NewError(contract.S102, "the registry hung up")}
		fa := wire(t, failing)
		var c collector
		_, err := fa.Create(contract.WithProgress(context.Background(), c.sink), &contract.CreateRequest{Image: "python"})
		e := sandboxErr(t, err, contract.S102)
		assert.Check(t, is.Contains(e.Message, "the registry hung up"))
		assert.DeepEqual(t, c.events(), events[:2])
	})
}

// workerMem is memAdapter with a worker side that remembers one request.
type workerMem struct {
	*memAdapter
	last *contract.WorkerStartRequest
}

func (w *workerMem) WorkerStart(_ context.Context, req *contract.WorkerStartRequest) (*contract.WorkerStartResponse, error) {
	w.last = req
	if req.VMID == "outside" {
		return nil, contract.HostRootRefused(req.HostDir, []string{"/srv"})
	}
	pid := 12
	return &contract.WorkerStartResponse{VMID: req.VMID, State: contract.WorkerRunning, PID: &pid}, nil
}

func (w *workerMem) WorkerStop(_ context.Context, req *contract.WorkerStopRequest) (*contract.WorkerStatus, error) {
	return &contract.WorkerStatus{VMID: req.VMID, State: contract.WorkerStopped}, nil
}

func (w *workerMem) WorkerStatus(_ context.Context, req *contract.WorkerStatusRequest) (*contract.WorkerStatus, error) {
	return nil, contract.UnknownWorker(req.VMID)
}

func (w *workerMem) WorkerList(context.Context, *contract.WorkerListRequest) (*contract.WorkerListResponse, error) {
	return &contract.WorkerListResponse{Workers: []contract.WorkerStatus{{VMID: "a", State: contract.WorkerRunning}}}, nil
}

func (w *workerMem) WorkerLogs(_ context.Context, req *contract.WorkerLogsRequest) (*contract.WorkerLogsResponse, error) {
	return &contract.WorkerLogsResponse{VMID: req.VMID, Entries: []contract.WorkerLogEntry{{Seq: 1, Stream: contract.LogStdout, Message: "hi"}}, Cursor: 1}, nil
}

func (w *workerMem) WorkerRemove(_ context.Context, req *contract.WorkerRemoveRequest) (*contract.WorkerRemoveResponse, error) {
	return &contract.WorkerRemoveResponse{VMID: req.VMID, Removed: true, StateDir: "/s/" + req.VMID}, nil
}

func TestWireWorkerOperations(t *testing.T) {
	impl := &workerMem{memAdapter: newMemAdapter()}
	a := wire(t, impl)
	w, ok := a.(contract.WorkerAdapter)
	assert.Assert(t, ok, "the gRPC client has a worker side")
	ctx := context.Background()

	req, err := contract.DecodeWorkerStartRequest(json.RawMessage(fullWorkerStart))
	assert.NilError(t, err)
	started, err := w.WorkerStart(ctx, req)
	assert.NilError(t, err)
	assert.Equal(t, *started.PID, 12)
	assert.DeepEqual(t, impl.last, req)

	req.VMID = "outside"
	_, err = w.WorkerStart(ctx, req)
	e := sandboxErr(t, err, contract.S501)
	assert.Check(t, is.Contains(e.Message, "compose::restart worker=sandbox-libkrun"))

	st, err := w.WorkerStop(ctx, &contract.WorkerStopRequest{VMID: "a", TimeoutMS: 1})
	assert.NilError(t, err)
	assert.Equal(t, st.State, contract.WorkerStopped)
	_, err = w.WorkerStatus(ctx, &contract.WorkerStatusRequest{VMID: "gone"})
	sandboxErr(t, err, contract.S002)
	list, err := w.WorkerList(ctx, &contract.WorkerListRequest{})
	assert.NilError(t, err)
	assert.Equal(t, len(list.Workers), 1)
	logs, err := w.WorkerLogs(ctx, &contract.WorkerLogsRequest{VMID: "a", Tail: 1})
	assert.NilError(t, err)
	assert.Equal(t, logs.Entries[0].Message, "hi")
	rm, err := w.WorkerRemove(ctx, &contract.WorkerRemoveRequest{VMID: "a"})
	assert.NilError(t, err)
	assert.Equal(t, rm.StateDir, "/s/a")
}

// TestWireWorkerUnsupported: an adapter without a worker side answers every
// worker call with S300 saying so, rather than gRPC's Unimplemented.
func TestWireWorkerUnsupported(t *testing.T) {
	a := wire(t, newMemAdapter())
	w := a.(contract.WorkerAdapter)
	_, err := w.WorkerList(context.Background(), &contract.WorkerListRequest{})
	e := sandboxErr(t, err, contract.S300)
	assert.Check(t, is.Contains(e.Message, "does not run worker VMs"))
}

const fullWorkerStart = `{"vm_id":"shop-3f2a1b9c-default-api","name":"api","namespace":"shop","image":"node",
"host_dir":"/srv/shop/./workers/api/","workdir":"src","install":"npm ci","command":"node index.mjs",
"env":{"B":"2","A":"1"},"config":{"file_name":"api.yaml","content":"port: 1\n"},"cpus":2,"memory_mb":1024,
"engine_url":"ws://127.0.0.1:49134","exclude":["/srv/shop/state/"],"include":["node_modules"],"wait":true,"engine_credential":"c0ffee","_caller_worker_id":"x"}`
