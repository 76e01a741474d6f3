package adapterjson_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
	"github.com/iii-sandbox/iii/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// engineChannels is the engine's in-process channels, as the plugin host
// hands them to the mapping.
type engineChannels struct{ eng *engine.Engine }

func (c engineChannels) OpenReader(ctx context.Context, ref protocol.StreamChannelRef) (io.ReadCloser, error) {
	r, err := c.eng.OpenChannelReader(ref)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (c engineChannels) OpenWriter(_ context.Context, ref protocol.StreamChannelRef) (adapterjson.ChannelWriter, error) {
	w, err := c.eng.OpenChannelWriter(ref)
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (c engineChannels) Create(context.Context) (w, r protocol.StreamChannelRef, err error) {
	w, r = c.eng.CreateChannel(0)
	return w, r, nil
}

func (engineChannels) Gone(err error) bool { return errors.Is(err, engine.ErrChannelClosed) }

// fixture is the hostdir adapter in process, a real engine's channels,
// and one created sandbox.
type fixture struct {
	eng *engine.Engine
	t   *adapterjson.Target
	ops map[string]adapterjson.OpFunc
	id  string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	t.Setenv(hostdir.EnvStateDir, t.TempDir())
	a := hostdir.NewAdapter(hclog.NewNullLogger())
	assert.NilError(t, a.Configure(context.Background(), []byte(`{"image_allowlist":["shell"]}`)))
	eng := engine.New(engine.Options{})
	life, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		assert.NilError(t, a.Shutdown(context.Background()))
		ctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		assert.NilError(t, eng.Close(ctx))
	})
	f := &fixture{eng: eng, ops: adapterjson.Ops(),
		t: &adapterjson.Target{Adapter: a, Name: "sandbox-hostdir", Channels: engineChannels{eng}, Life: life}}
	out := f.call(t, contract.OpCreate, `{"image":"shell"}`)
	f.id = out.(*contract.CreateResponse).SandboxID
	return f
}

func (f *fixture) do(op, payload string) (any, error) {
	return f.ops[op](context.Background(), f.t, json.RawMessage(payload))
}

func (f *fixture) call(t *testing.T, op, payload string) any {
	t.Helper()
	out, err := f.do(op, payload)
	assert.NilError(t, err, "%s %s", op, payload)
	return out
}

func (f *fixture) readAll(t *testing.T, ref protocol.StreamChannelRef) []byte {
	t.Helper()
	r, err := f.eng.OpenChannelReader(ref)
	assert.NilError(t, err)
	defer r.Close()
	b, err := io.ReadAll(r)
	assert.NilError(t, err)
	return b
}

func TestOpsCoverEveryOperation(t *testing.T) {
	want := append(append(append(contract.Ops(), contract.OpAdapterInfo), contract.WorkerOps()...), contract.PauseOps()...)
	var got []string
	for op, fn := range adapterjson.Ops() {
		assert.Assert(t, fn != nil, op)
		got = append(got, op)
	}
	slices.Sort(want)
	slices.Sort(got)
	assert.DeepEqual(t, got, want)
}

// TestErrors: a request the contract's decoders refuse is the S-code the
// caller gets, before the adapter is asked.
func TestErrors(t *testing.T) {
	f := setup(t)
	for _, tc := range []struct {
		op, payload string
		want        contract.Code
	}{
		{contract.OpExec, `{"sandbox_id":"nope"}`, contract.S001},
		{contract.OpExec, `[]`, contract.S001},
		{contract.OpStop, `{}`, contract.S001},
		{contract.OpCreate, `{"image":"shell","progress":{"channel_id":"x","access_key":"y","direction":"write"}}`, contract.S001},
		{contract.OpFsWrite, `{"sandbox_id":"` + f.id + `","path":"/f","content":{"channel_id":"x","access_key":"y","direction":"read"}}`, contract.S210},
		{contract.OpFsRead, `{"sandbox_id":"` + f.id + `"}`, contract.S210},
		{contract.OpFsRead, `{"sandbox_id":"` + f.id + `","path":"/missing"}`, contract.S211},
		{contract.OpWorkerStatus, `{"vm_id":"x"}`, ""},
	} {
		t.Run(tc.op+" "+tc.payload, func(t *testing.T) {
			_, err := f.do(tc.op, tc.payload)
			if tc.want == "" {
				assert.Assert(t, err != nil)
				return
			}
			var se *contract.Error
			assert.Assert(t, errors.As(err, &se), "%v", err)
			assert.Equal(t, se.Code, tc.want, se.Message)
		})
	}
}

// adapterOnly hides an adapter's worker side: the contract's Adapter and
// nothing more.
type adapterOnly struct{ contract.Adapter }

func TestWorkerOpsWithoutWorkerSide(t *testing.T) {
	f := setup(t)
	// hostdir runs workers; without its worker side, worker ops must say
	// the adapter runs none.
	f.t.Adapter = adapterOnly{f.t.Adapter}
	_, ok := f.t.Adapter.(contract.WorkerAdapter)
	assert.Assert(t, !ok)
	_, err := f.do(contract.OpWorkerList, `{}`)
	assert.Assert(t, contract.IsCode(err, contract.S300), "%v", err)
	assert.ErrorContains(t, err, `"sandbox-hostdir" does not run worker VMs`)
}

// TestFiles: fs::write from inline bytes and from a channel, fs::read of
// a small file (inline body and channel) and of one past the inline limit
// (channel only).
func TestFiles(t *testing.T) {
	f := setup(t)
	f.call(t, contract.OpFsWrite, `{"sandbox_id":"`+f.id+`","path":"/inline","content":"hello"}`)

	big := bytes.Repeat([]byte("0123456789abcdef"), contract.InlineBodyLimit/16+1000)
	w, r := f.eng.CreateChannel(0)
	cw, err := f.eng.OpenChannelWriter(w)
	assert.NilError(t, err)
	go func() {
		_, _ = cw.Write(big)
		_ = cw.Close()
	}()
	rj, _ := json.Marshal(r)
	out := f.call(t, contract.OpFsWrite, `{"sandbox_id":"`+f.id+`","path":"/big","content":`+string(rj)+`}`)
	assert.Equal(t, out.(*contract.FsWriteResponse).BytesWritten, uint64(len(big)))

	small := f.call(t, contract.OpFsRead, `{"sandbox_id":"`+f.id+`","path":"/inline"}`).(*contract.FsReadResponse)
	assert.Assert(t, small.Body != nil)
	assert.Equal(t, *small.Body, "hello")
	assert.Equal(t, string(f.readAll(t, small.Content)), "hello")

	large := f.call(t, contract.OpFsRead, `{"sandbox_id":"`+f.id+`","path":"/big"}`).(*contract.FsReadResponse)
	assert.Assert(t, is.Nil(large.Body))
	assert.Equal(t, large.Size, uint64(len(big)))
	assert.Assert(t, bytes.Equal(f.readAll(t, large.Content), big))
}

// TestFsReadRefused: a host that refuses the background stream (it is
// closing) fails the call with its own error and leaves nothing open.
func TestFsReadRefused(t *testing.T) {
	f := setup(t)
	f.call(t, contract.OpFsWrite, `{"sandbox_id":"`+f.id+`","path":"/f","content":"hello"}`)
	closing := contract.NewError(contract.S301, "the engine is stopping")
	f.t.Go = func(func()) error { return closing }
	_, err := f.do(contract.OpFsRead, `{"sandbox_id":"`+f.id+`","path":"/f"}`)
	assert.Equal(t, err, error(closing))
}

// TestProgress: create with a progress channel writes JSON events into
// it and closes it before the reply.
func TestProgress(t *testing.T) {
	f := setup(t)
	w, r := f.eng.CreateChannel(0)
	wj, _ := json.Marshal(w)
	out := f.call(t, contract.OpCreate, `{"image":"shell","progress":`+string(wj)+`}`).(*contract.CreateResponse)
	rd, err := f.eng.OpenChannelReader(r)
	assert.NilError(t, err)
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var phases []string
	for {
		it, err := rd.ReadItem(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		assert.NilError(t, err, "the channel is closed before the reply")
		assert.Assert(t, it.Text)
		var ev contract.ProgressEvent
		assert.NilError(t, json.Unmarshal(it.Data, &ev), string(it.Data))
		phases = append(phases, ev.Phase)
		if ev.Phase == contract.ProgressReady {
			assert.Equal(t, ev.SandboxID, out.SandboxID)
		}
	}
	assert.Assert(t, slices.Contains(phases, contract.ProgressReady), strings.Join(phases, ","))
}

// TestPauseWithoutCapability: an adapter that does not implement
// contract.PauseAdapter answers sandbox::pause and sandbox::resume with
// S006, naming itself.
func TestPauseWithoutCapability(t *testing.T) {
	for _, op := range contract.PauseOps() {
		_, err := adapterjson.Ops()[op](context.Background(), &adapterjson.Target{Name: "plain", Adapter: plainAdapter{}}, json.RawMessage(`{"sandbox_id":"0b7c3a52-4c0e-4b6a-9a43-5bd0c6d8a001"}`))
		var e *contract.Error
		assert.Assert(t, errors.As(err, &e), op)
		assert.Equal(t, e.Code, contract.S006, op)
		assert.Check(t, strings.Contains(e.Message, `"plain"`), e.Message)
	}
}

// plainAdapter is a contract.Adapter and nothing more.
type plainAdapter struct{ contract.Adapter }
