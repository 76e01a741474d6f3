package contract

import (
	"context"
	"io"
)

// Adapter is the sandbox contract as a Go interface: one method per
// operation, plus Info and Configure. An adapter implements it and serves
// it with go-plugin (package adapterrpc, which runs package adapterjson's
// mapping of the JSON calls against it); Go code that talks to an adapter
// process holds adapterrpc.Client, which implements it over the same JSON.
//
// Requests arrive decoded and validated (see the Decode functions): ids are
// canonical UUIDs, defaults are applied and exec's command is resolved into
// Argv. Failures should be *Error values with the code the contract names
// for them; any other error reaches callers as S216 from fs operations and
// S300 from the others, so a caller always gets an S-code.
type Adapter interface {
	// Info reports the adapter's name, version, contract version and
	// back-end facts (adapter::info).
	Info(ctx context.Context) (*AdapterInfo, error)
	// Configure hands the adapter its configuration as a JSON object, once
	// after start and before any operation. The adapter validates it
	// fail-closed: an error rejects the configuration and says why.
	Configure(ctx context.Context, configJSON []byte) error

	Create(ctx context.Context, req *CreateRequest) (*CreateResponse, error)
	Exec(ctx context.Context, req *ExecRequest) (*ExecResponse, error)
	Run(ctx context.Context, req *RunRequest) (*RunResponse, error)
	List(ctx context.Context, req *ListRequest) (*ListResponse, error)
	Stop(ctx context.Context, req *StopRequest) (*StopResponse, error)
	CatalogList(ctx context.Context, req *CatalogListRequest) (*CatalogListResponse, error)

	FsLs(ctx context.Context, req *FsLsRequest) (*FsLsResponse, error)
	FsStat(ctx context.Context, req *FsStatRequest) (*FsEntry, error)
	FsMkdir(ctx context.Context, req *FsMkdirRequest) (*FsMkdirResponse, error)
	// FsWrite writes everything content yields to req.Path. req.Content is
	// not set: the host has already turned it into content.
	FsWrite(ctx context.Context, req *FsWriteRequest, content io.Reader) (*FsWriteResponse, error)
	// FsRead returns the file's metadata and a reader of its bytes, which
	// the caller must close. The reader lives no longer than ctx.
	FsRead(ctx context.Context, req *FsReadRequest) (*FsReadMeta, io.ReadCloser, error)
	FsRm(ctx context.Context, req *FsRmRequest) (*FsRmResponse, error)
	FsChmod(ctx context.Context, req *FsChmodRequest) (*FsChmodResponse, error)
	FsMv(ctx context.Context, req *FsMvRequest) (*FsMvResponse, error)
	FsGrep(ctx context.Context, req *FsGrepRequest) (*FsGrepResponse, error)
	FsSed(ctx context.Context, req *FsSedRequest) (*FsSedResponse, error)
}

// ConfigRejectedError is how a host learns that an adapter refused its
// configuration; Reason is the adapter's explanation. Hosts report it to
// callers as S301 (the adapter cannot run), naming the reason.
type ConfigRejectedError struct {
	Reason string
	// Err is the adapter's sandbox error, when it sent one.
	Err *Error
}

func (e *ConfigRejectedError) Error() string {
	return "sandbox adapter rejected its configuration: " + e.Reason
}

// Unwrap exposes the adapter's sandbox error, if any.
func (e *ConfigRejectedError) Unwrap() error {
	if e.Err == nil {
		return nil
	}
	return e.Err
}

// fallbackCode is the code a plain (non-*Error) failure of op gets.
func fallbackCode(op string) Code {
	if IsFsOp(op) {
		return S216
	}
	return S300
}
