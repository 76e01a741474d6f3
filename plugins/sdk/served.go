package sdk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"runtime/debug"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/procstats"
)

// servedAdapter is what Serve hands go-plugin: the author's adapter, plus
// what every adapter process needs and no author should have to write.
//
//   - A panic in an operation becomes an S-code error (S216 for fs
//     operations, S300 otherwise) and a logged stack, instead of killing
//     the process and every sandbox it holds.
//   - A rejected Configure is logged with its reason and stops the
//     process with ExitConfigRejected once the reply has gone out.
//   - Info fills in the name, version and contract version the adapter
//     left empty, from ServeConfig and package contract, and adds the
//     process's runtime block (RuntimeFactKey).
type servedAdapter struct {
	inner contract.Adapter
	cfg   ServeConfig
	log   hclog.Logger
	st    *stopper
	// facts are added to Info's facts (a remote adapter's host_name).
	facts map[string]any
	// instance is this process's InstanceFactKey.
	instance string
	// configured is set once a Configure succeeded: a later Configure is
	// a reload (contract.CapabilityReconfigure), whose refusal leaves the
	// adapter running with the configuration it has.
	configMu   sync.Mutex
	configured bool
}

// InstanceFactKey is the adapter::info fact that names the adapter process:
// random, new in every process, so whoever reads it twice knows whether
// the adapter restarted in between (and so lost its sandboxes). The fleet
// router compares it to tell a host that restarted from one that only
// reconnected (docs/scale-out.md).
const InstanceFactKey = "instance_id"

// newInstanceID is a random 128-bit id in hex.
func newInstanceID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

var _ contract.Adapter = (*servedAdapter)(nil)

func newServedAdapter(inner contract.Adapter, cfg ServeConfig, log hclog.Logger, st *stopper) *servedAdapter {
	return &servedAdapter{inner: inner, cfg: cfg, log: log, st: st, instance: newInstanceID()}
}

// recovered turns a panic in op into an S-code error in *err.
func (a *servedAdapter) recovered(op string, err *error) {
	if r := recover(); r != nil {
		a.log.Error("the adapter panicked", "op", op, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		code := contract.S300
		if contract.IsFsOp(op) {
			code = contract.S216
		}
		*err = Errorf(code, "the sandbox adapter failed while serving %s (internal error: %v); the adapter logged the details", op, r)
	}
}

func (a *servedAdapter) Info(ctx context.Context) (out *contract.AdapterInfo, err error) {
	defer a.recovered(contract.OpAdapterInfo, &err)
	out, err = a.inner.Info(ctx)
	if err != nil || out == nil {
		return out, err
	}
	c := *out
	if c.Adapter == "" {
		c.Adapter = a.cfg.Name
	}
	if c.AdapterVersion == "" {
		c.AdapterVersion = versionOr(a.cfg.Version)
	}
	if c.Contract == (contract.ContractVersion{}) {
		c.Contract = contract.Current()
	}
	c.Facts = withRuntime(c.Facts, procstats.Read())
	c.Facts[InstanceFactKey] = a.instance
	maps.Copy(c.Facts, a.facts)
	return &c, nil
}

func (a *servedAdapter) Configure(ctx context.Context, configJSON []byte) (err error) {
	defer a.recovered("configure", &err)
	a.configMu.Lock()
	reload := a.configured
	a.configMu.Unlock()
	defer func() {
		if err == nil || ctx.Err() != nil {
			return
		}
		if reload {
			a.log.Warn("configuration reload refused; the adapter keeps its configuration", "reason", err.Error())
			return
		}
		a.log.Error("configuration rejected; the adapter will exit", "reason", err.Error())
		// The graceful stop waits for this reply to be written.
		a.st.stop(stopRejected, ExitConfigRejected)
	}()
	// Not in a deferred function: a Configure that panicked did not
	// configure anything.
	if err = a.inner.Configure(ctx, configJSON); err == nil {
		a.configMu.Lock()
		a.configured = true
		a.configMu.Unlock()
	}
	return err
}

func (a *servedAdapter) Create(ctx context.Context, req *contract.CreateRequest) (out *contract.CreateResponse, err error) {
	defer a.recovered(contract.OpCreate, &err)
	return a.inner.Create(ctx, req)
}

func (a *servedAdapter) Exec(ctx context.Context, req *contract.ExecRequest) (out *contract.ExecResponse, err error) {
	defer a.recovered(contract.OpExec, &err)
	return a.inner.Exec(ctx, req)
}

func (a *servedAdapter) Run(ctx context.Context, req *contract.RunRequest) (out *contract.RunResponse, err error) {
	defer a.recovered(contract.OpRun, &err)
	return a.inner.Run(ctx, req)
}

func (a *servedAdapter) List(ctx context.Context, req *contract.ListRequest) (out *contract.ListResponse, err error) {
	defer a.recovered(contract.OpList, &err)
	return a.inner.List(ctx, req)
}

func (a *servedAdapter) Stop(ctx context.Context, req *contract.StopRequest) (out *contract.StopResponse, err error) {
	defer a.recovered(contract.OpStop, &err)
	return a.inner.Stop(ctx, req)
}

func (a *servedAdapter) CatalogList(ctx context.Context, req *contract.CatalogListRequest) (out *contract.CatalogListResponse, err error) {
	defer a.recovered(contract.OpCatalogList, &err)
	return a.inner.CatalogList(ctx, req)
}

func (a *servedAdapter) FsLs(ctx context.Context, req *contract.FsLsRequest) (out *contract.FsLsResponse, err error) {
	defer a.recovered(contract.OpFsLs, &err)
	return a.inner.FsLs(ctx, req)
}

func (a *servedAdapter) FsStat(ctx context.Context, req *contract.FsStatRequest) (out *contract.FsEntry, err error) {
	defer a.recovered(contract.OpFsStat, &err)
	return a.inner.FsStat(ctx, req)
}

func (a *servedAdapter) FsMkdir(ctx context.Context, req *contract.FsMkdirRequest) (out *contract.FsMkdirResponse, err error) {
	defer a.recovered(contract.OpFsMkdir, &err)
	return a.inner.FsMkdir(ctx, req)
}

func (a *servedAdapter) FsWrite(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (out *contract.FsWriteResponse, err error) {
	defer a.recovered(contract.OpFsWrite, &err)
	return a.inner.FsWrite(ctx, req, content)
}

func (a *servedAdapter) FsRead(ctx context.Context, req *contract.FsReadRequest) (meta *contract.FsReadMeta, body io.ReadCloser, err error) {
	defer a.recovered(contract.OpFsRead, &err)
	meta, body, err = a.inner.FsRead(ctx, req)
	if body != nil {
		body = &recoveringBody{inner: body, a: a}
	}
	return meta, body, err
}

func (a *servedAdapter) FsRm(ctx context.Context, req *contract.FsRmRequest) (out *contract.FsRmResponse, err error) {
	defer a.recovered(contract.OpFsRm, &err)
	return a.inner.FsRm(ctx, req)
}

func (a *servedAdapter) FsChmod(ctx context.Context, req *contract.FsChmodRequest) (out *contract.FsChmodResponse, err error) {
	defer a.recovered(contract.OpFsChmod, &err)
	return a.inner.FsChmod(ctx, req)
}

func (a *servedAdapter) FsMv(ctx context.Context, req *contract.FsMvRequest) (out *contract.FsMvResponse, err error) {
	defer a.recovered(contract.OpFsMv, &err)
	return a.inner.FsMv(ctx, req)
}

func (a *servedAdapter) FsGrep(ctx context.Context, req *contract.FsGrepRequest) (out *contract.FsGrepResponse, err error) {
	defer a.recovered(contract.OpFsGrep, &err)
	return a.inner.FsGrep(ctx, req)
}

func (a *servedAdapter) FsSed(ctx context.Context, req *contract.FsSedRequest) (out *contract.FsSedResponse, err error) {
	defer a.recovered(contract.OpFsSed, &err)
	return a.inner.FsSed(ctx, req)
}

// recoveringBody keeps a panic in an adapter's fs::read body from killing
// the process: the read fails with S216 instead.
type recoveringBody struct {
	inner io.ReadCloser
	a     *servedAdapter
	once  sync.Once
}

func (b *recoveringBody) Read(p []byte) (n int, err error) {
	defer b.a.recovered(contract.OpFsRead, &err)
	return b.inner.Read(p)
}

func (b *recoveringBody) Close() (err error) {
	defer b.a.recovered(contract.OpFsRead, &err)
	b.once.Do(func() { err = b.inner.Close() })
	return err
}
