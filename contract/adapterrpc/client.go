package adapterrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	pb "github.com/iii-sandbox/iii/contract/proto"
	"github.com/iii-sandbox/iii/protocol"
)

// Client calls an adapter process. Call is the engine's path: the caller's
// JSON in, the reply JSON or the error body out, nothing decoded. The
// typed methods make Client a contract.Adapter (and WorkerAdapter,
// PauseAdapter) for Go code that holds no JSON (the host's Info and
// Configure, tests, benchmarks): they marshal the request to the public
// JSON and decode the reply into the contract's types, so they run the
// same path as every other caller.
//
// Errors of the typed methods are one of:
//
//   - *contract.Error: the adapter answered with a sandbox error;
//   - *contract.ConfigRejectedError: from Configure, the adapter refused
//     its config;
//   - the caller's context error, wrapped, when ctx ended first;
//   - any other error: the adapter could not be reached or broke the
//     protocol. Hosts report those as S301 (adapter not running).
type Client struct {
	rpc pb.SandboxAdapterClient
	ch  adapterjson.Channels
	// serve starts the host's channel service and returns its broker id
	// (0: none). It runs once, at the first call: go-plugin's broker
	// hands the service's address to the adapter for five seconds only,
	// so the adapter must dial it right after it starts.
	serve func() uint32
	once  sync.Once
	id    uint32
}

var (
	_ contract.Adapter       = (*Client)(nil)
	_ contract.WorkerAdapter = (*Client)(nil)
	_ contract.PauseAdapter  = (*Client)(nil)
)

// NewClient calls the adapter served on conn without go-plugin (see
// RegisterServer): no channels, so only the operations that name none
// work.
func NewClient(conn grpc.ClientConnInterface) *Client {
	return newClient(conn, NewMemChannels(), func() uint32 { return 0 })
}

func newClient(conn grpc.ClientConnInterface, ch adapterjson.Channels, serve func() uint32) *Client {
	return &Client{rpc: pb.NewSandboxAdapterClient(conn), ch: ch, serve: serve}
}

// callOpts lets replies up to MaxMessageBytes through whatever dial options
// the host's gRPC connection has.
func callOpts() []grpc.CallOption {
	return []grpc.CallOption{grpc.MaxCallRecvMsgSize(contract.MaxMessageBytes), grpc.MaxCallSendMsgSize(contract.MaxMessageBytes)}
}

// Channels are the host's channels the adapter reaches: a MemChannels of
// the client's own unless the plugin was given others.
func (c *Client) Channels() adapterjson.Channels { return c.ch }

// invoke runs op; a transport failure comes back wrapped, the caller's
// context error when ctx ended first.
func (c *Client) invoke(ctx context.Context, op string, payload []byte) (*pb.InvokeReply, error) {
	c.once.Do(func() { c.id = c.serve() })
	out, err := c.rpc.Invoke(ctx, &pb.InvokeRequest{Op: op, Payload: payload, Channels: c.id}, callOpts()...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sandbox adapter %s: %w", op, ctx.Err())
		}
		return nil, fmt.Errorf("sandbox adapter %s: %w", op, err)
	}
	return out, nil
}

// Call runs op with the caller's JSON as it is. It returns the reply JSON,
// or the adapter's failure as the invocation's error body (the S-code and
// the error's wire object), or err when the adapter could not be reached.
func (c *Client) Call(ctx context.Context, op string, payload json.RawMessage) (json.RawMessage, *protocol.ErrorBody, error) {
	out, err := c.invoke(ctx, op, payload)
	if err != nil {
		return nil, nil, err
	}
	if len(out.GetError()) > 0 {
		return nil, &protocol.ErrorBody{Code: out.GetCode(), Message: string(out.GetError())}, nil
	}
	return out.GetResult(), nil, nil
}

// encodeRequest is req's public JSON, without the top-level numbers that
// are zero: Go callers write a zero timeout_ms or max_line_bytes for "the
// contract's default", which the JSON contract spells by leaving the key
// out (an explicit 0 is refused). No request field has a default other
// than zero where zero is also valid, so dropping them changes nothing
// else.
func encodeRequest(req any) ([]byte, error) {
	b, err := contract.EncodeJSON(req)
	if err != nil || !bytes.Contains(b, []byte(":0")) {
		return b, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return b, nil //nolint:nilerr // not an object: nothing to drop
	}
	for k, v := range fields {
		if string(v) == "0" {
			delete(fields, k)
		}
	}
	return contract.EncodeJSON(fields)
}

// call runs op with req as JSON and decodes the reply into out.
func (c *Client) call(ctx context.Context, op string, req, out any) error {
	b, err := encodeRequest(req)
	if err != nil {
		return fmt.Errorf("encode the %s request: %w", op, err)
	}
	res, body, err := c.Call(ctx, op, b)
	if err != nil {
		return err
	}
	if body != nil {
		if e, ok := contract.FromErrorBody(body); ok {
			return e
		}
		return fmt.Errorf("sandbox adapter %s: an error that is not a sandbox error: %s", op, body.Message)
	}
	if err := json.Unmarshal(res, out); err != nil {
		return fmt.Errorf("sandbox adapter %s: decode the reply: %w", op, err)
	}
	return nil
}

func typed[Resp any](ctx context.Context, c *Client, op string, req any) (*Resp, error) {
	var out Resp
	if err := c.call(ctx, op, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Info calls adapter::info.
func (c *Client) Info(ctx context.Context) (*contract.AdapterInfo, error) {
	return typed[contract.AdapterInfo](ctx, c, contract.OpAdapterInfo, struct{}{})
}

// Configure hands the adapter its configuration.
func (c *Client) Configure(ctx context.Context, configJSON []byte) error {
	out, err := c.invoke(ctx, contract.OpConfigure, configJSON)
	if err != nil {
		return err
	}
	if !out.GetRejected() {
		return nil
	}
	rej := &contract.ConfigRejectedError{Reason: out.GetReason()}
	if len(out.GetError()) > 0 {
		var e contract.Error
		if err := json.Unmarshal(out.GetError(), &e); err == nil {
			rej.Err = &e
		}
	}
	return rej
}

// Create calls create. When ctx carries a progress sink
// (contract.WithProgress) and the client's channels can be read message
// by message (MemChannels), the adapter's progress events reach the sink.
func (c *Client) Create(ctx context.Context, req *contract.CreateRequest) (*contract.CreateResponse, error) {
	q := *req
	done, err := c.watchProgress(ctx, &q.Progress)
	if err != nil {
		return nil, err
	}
	defer done()
	return typed[contract.CreateResponse](ctx, c, contract.OpCreate, &q)
}

// Run calls run, with progress like Create.
func (c *Client) Run(ctx context.Context, req *contract.RunRequest) (*contract.RunResponse, error) {
	q := *req
	done, err := c.watchProgress(ctx, &q.Progress)
	if err != nil {
		return nil, err
	}
	defer done()
	return typed[contract.RunResponse](ctx, c, contract.OpRun, &q)
}

// watchProgress points *ref at a new channel whose events go to ctx's
// progress sink. done waits for the events the adapter wrote before its
// reply (it closes the channel first), bounded by ProgressDrain.
func (c *Client) watchProgress(ctx context.Context, ref **protocol.StreamChannelRef) (done func(), err error) {
	sink := contract.ProgressFrom(ctx)
	if sink == nil {
		return func() {}, nil
	}
	w, r, err := c.ch.Create(ctx)
	if err != nil {
		return nil, fmt.Errorf("create the progress channel: %w", err)
	}
	rd, err := c.ch.OpenReader(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("open the progress channel: %w", err)
	}
	pr, ok := rd.(ProgressReader)
	if !ok {
		_ = rd.Close()
		return func() {}, nil
	}
	*ref = &w
	gctx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			s, err := pr.Next(gctx)
			if err != nil {
				return
			}
			if ev, err := contract.DecodeProgressEvent([]byte(s)); err == nil {
				sink(*ev)
			}
		}
	}()
	return func() {
		t := time.NewTimer(adapterjson.ProgressDrain)
		select {
		case <-finished:
		case <-t.C:
		}
		t.Stop()
		cancel()
		<-finished
		_ = rd.Close()
	}, nil
}

// Exec calls exec.
func (c *Client) Exec(ctx context.Context, req *contract.ExecRequest) (*contract.ExecResponse, error) {
	return typed[contract.ExecResponse](ctx, c, contract.OpExec, req)
}

// List calls list.
func (c *Client) List(ctx context.Context, req *contract.ListRequest) (*contract.ListResponse, error) {
	return typed[contract.ListResponse](ctx, c, contract.OpList, req)
}

// Stop calls stop.
func (c *Client) Stop(ctx context.Context, req *contract.StopRequest) (*contract.StopResponse, error) {
	return typed[contract.StopResponse](ctx, c, contract.OpStop, req)
}

// CatalogList calls catalog::list.
func (c *Client) CatalogList(ctx context.Context, req *contract.CatalogListRequest) (*contract.CatalogListResponse, error) {
	return typed[contract.CatalogListResponse](ctx, c, contract.OpCatalogList, req)
}

// FsLs calls fs::ls.
func (c *Client) FsLs(ctx context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	return typed[contract.FsLsResponse](ctx, c, contract.OpFsLs, req)
}

// FsStat calls fs::stat.
func (c *Client) FsStat(ctx context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	return typed[contract.FsEntry](ctx, c, contract.OpFsStat, req)
}

// FsMkdir calls fs::mkdir.
func (c *Client) FsMkdir(ctx context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	return typed[contract.FsMkdirResponse](ctx, c, contract.OpFsMkdir, req)
}

// FsRm calls fs::rm.
func (c *Client) FsRm(ctx context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	return typed[contract.FsRmResponse](ctx, c, contract.OpFsRm, req)
}

// FsChmod calls fs::chmod.
func (c *Client) FsChmod(ctx context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	return typed[contract.FsChmodResponse](ctx, c, contract.OpFsChmod, req)
}

// FsMv calls fs::mv.
func (c *Client) FsMv(ctx context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	return typed[contract.FsMvResponse](ctx, c, contract.OpFsMv, req)
}

// FsGrep calls fs::grep.
func (c *Client) FsGrep(ctx context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	return typed[contract.FsGrepResponse](ctx, c, contract.OpFsGrep, req)
}

// FsSed calls fs::sed.
func (c *Client) FsSed(ctx context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	return typed[contract.FsSedResponse](ctx, c, contract.OpFsSed, req)
}

// FsWrite streams content to the adapter through a channel the request
// names. When content fails mid-way the failure is reported as S218 (the
// source stream aborted), unless it already is a sandbox error.
func (c *Client) FsWrite(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	if content == nil {
		content = eofReader{}
	}
	wref, rref, err := c.ch.Create(ctx)
	if err != nil {
		return nil, fmt.Errorf("create the fs::write channel: %w", err)
	}
	w, err := c.ch.OpenWriter(ctx, wref)
	if err != nil {
		return nil, fmt.Errorf("open the fs::write channel: %w", err)
	}
	q := *req
	q.Content = contract.WriteContent{Channel: &rref}
	fctx, cancel := context.WithCancel(ctx)
	var (
		wg      sync.WaitGroup
		feedErr error
	)
	wg.Go(func() { feedErr = feed(fctx, w, content, c.ch) })
	out, err := typed[contract.FsWriteResponse](ctx, c, contract.OpFsWrite, &q)
	cancel()
	wg.Wait()
	if mc, ok := c.ch.(*MemChannels); ok {
		mc.drop(rref.ChannelID)
	}
	if feedErr != nil && ctx.Err() == nil {
		var e *contract.Error
		if errors.As(feedErr, &e) {
			return nil, e
		}
		return nil, contract.NewError(contract.S218, "the content for fs::write of %s broke off: %v", req.Path, feedErr)
	}
	return out, err
}

// feed copies content into w and closes it; a failed read aborts it, so
// the adapter sees a broken stream rather than a short file. A reader
// that went away is not a failure of the content.
func feed(ctx context.Context, w adapterjson.ChannelWriter, content io.Reader, ch adapterjson.Channels) error {
	buf := make([]byte, contract.ChunkSize)
	for {
		b, rerr := nextChunk(content, buf)
		if len(b) > 0 {
			if _, err := w.WriteContext(ctx, b); err != nil {
				w.Abort()
				if ch.Gone(err) || ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			if err := w.Close(); err != nil && !ch.Gone(err) {
				return err
			}
			return nil
		}
		if rerr != nil {
			w.Abort()
			return rerr
		}
	}
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// FsRead calls fs::read and opens the channel of its reply. The returned
// reader yields the file's bytes; closing it ends the stream.
func (c *Client) FsRead(ctx context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	out, err := typed[contract.FsReadResponse](ctx, c, contract.OpFsRead, req)
	if err != nil {
		return nil, nil, err
	}
	r, err := c.ch.OpenReader(ctx, out.Content)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox adapter %s: open the reply's channel: %w", contract.OpFsRead, err)
	}
	return &contract.FsReadMeta{Size: out.Size, Mode: out.Mode, Mtime: out.Mtime}, r, nil
}

// WorkerStart calls worker::start.
func (c *Client) WorkerStart(ctx context.Context, req *contract.WorkerStartRequest) (*contract.WorkerStartResponse, error) {
	return typed[contract.WorkerStartResponse](ctx, c, contract.OpWorkerStart, req)
}

// WorkerStop calls worker::stop.
func (c *Client) WorkerStop(ctx context.Context, req *contract.WorkerStopRequest) (*contract.WorkerStatus, error) {
	return typed[contract.WorkerStatus](ctx, c, contract.OpWorkerStop, req)
}

// WorkerStatus calls worker::status.
func (c *Client) WorkerStatus(ctx context.Context, req *contract.WorkerStatusRequest) (*contract.WorkerStatus, error) {
	return typed[contract.WorkerStatus](ctx, c, contract.OpWorkerStatus, req)
}

// WorkerList calls worker::list.
func (c *Client) WorkerList(ctx context.Context, req *contract.WorkerListRequest) (*contract.WorkerListResponse, error) {
	return typed[contract.WorkerListResponse](ctx, c, contract.OpWorkerList, req)
}

// WorkerLogs calls worker::logs.
func (c *Client) WorkerLogs(ctx context.Context, req *contract.WorkerLogsRequest) (*contract.WorkerLogsResponse, error) {
	return typed[contract.WorkerLogsResponse](ctx, c, contract.OpWorkerLogs, req)
}

// WorkerRemove calls worker::remove.
func (c *Client) WorkerRemove(ctx context.Context, req *contract.WorkerRemoveRequest) (*contract.WorkerRemoveResponse, error) {
	return typed[contract.WorkerRemoveResponse](ctx, c, contract.OpWorkerRemove, req)
}

// Pause calls pause.
func (c *Client) Pause(ctx context.Context, req *contract.PauseRequest) (*contract.SandboxStatus, error) {
	return typed[contract.SandboxStatus](ctx, c, contract.OpPause, req)
}

// Resume calls resume.
func (c *Client) Resume(ctx context.Context, req *contract.ResumeRequest) (*contract.SandboxStatus, error) {
	return typed[contract.SandboxStatus](ctx, c, contract.OpResume, req)
}
