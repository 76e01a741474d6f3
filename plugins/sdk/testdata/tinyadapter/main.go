// Command tinyadapter is the smallest adapter served with sdk.Serve. The sdk
// tests build it and drive it through go-plugin as a real subprocess; its
// behaviour is steered by TINY_* environment variables so one binary covers
// every case.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk"
)

func main() {
	sdk.Serve(sdk.ServeConfig{
		Name:    "tinyadapter",
		Version: "0.0.1-test",
		New: func(ctx context.Context, log hclog.Logger) (contract.Adapter, error) {
			if os.Getenv("TINY_STRAY") != "" {
				// Everything a careless adapter might do to stdout before
				// the handshake: the os.Stdout variable and fd 1 itself.
				fmt.Println("stray println before the handshake")
				fd1 := os.NewFile(1, "fd1")
				fmt.Fprintln(fd1, "stray write on fd 1 before the handshake")
			}
			if msg := os.Getenv("TINY_NEW_FAIL"); msg != "" {
				return nil, fmt.Errorf("%s", msg)
			}
			return &tiny{log: log}, nil
		},
	})
}

type tiny struct {
	log hclog.Logger
}

func (t *tiny) Info(context.Context) (*contract.AdapterInfo, error) {
	if os.Getenv("TINY_STRAY") != "" {
		fmt.Println("stray println during a call")
	}
	return &contract.AdapterInfo{Facts: map[string]any{"pid": os.Getpid()}}, nil
}

func (t *tiny) Configure(_ context.Context, configJSON []byte) error {
	var cfg map[string]any
	if err := json.Unmarshal(configJSON, &cfg); err != nil {
		return fmt.Errorf("the configuration is not a JSON object: %v", err)
	}
	if reason, ok := cfg["reject"].(string); ok {
		return fmt.Errorf("config key \"reject\": %s", reason)
	}
	t.log.Info("configured", "keys", len(cfg))
	return nil
}

func (t *tiny) Shutdown(context.Context) error {
	t.log.Info("tiny adapter shutdown called")
	return nil
}

func (t *tiny) Create(context.Context, *contract.CreateRequest) (*contract.CreateResponse, error) {
	if os.Getenv("TINY_PANIC") != "" {
		panic("tiny adapter panics on create")
	}
	return nil, unsupported(contract.OpCreate)
}

func (t *tiny) List(context.Context, *contract.ListRequest) (*contract.ListResponse, error) {
	return &contract.ListResponse{}, nil
}

func unsupported(op string) error {
	return sdk.Errorf(contract.S300, "the test adapter does not implement %s", op)
}

func (t *tiny) Exec(context.Context, *contract.ExecRequest) (*contract.ExecResponse, error) {
	return nil, unsupported(contract.OpExec)
}

func (t *tiny) Run(context.Context, *contract.RunRequest) (*contract.RunResponse, error) {
	return nil, unsupported(contract.OpRun)
}

func (t *tiny) Stop(context.Context, *contract.StopRequest) (*contract.StopResponse, error) {
	return nil, unsupported(contract.OpStop)
}

func (t *tiny) CatalogList(context.Context, *contract.CatalogListRequest) (*contract.CatalogListResponse, error) {
	return &contract.CatalogListResponse{}, nil
}

func (t *tiny) FsLs(context.Context, *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	return nil, unsupported(contract.OpFsLs)
}

func (t *tiny) FsStat(context.Context, *contract.FsStatRequest) (*contract.FsEntry, error) {
	return nil, unsupported(contract.OpFsStat)
}

func (t *tiny) FsMkdir(context.Context, *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	return nil, unsupported(contract.OpFsMkdir)
}

func (t *tiny) FsWrite(context.Context, *contract.FsWriteRequest, io.Reader) (*contract.FsWriteResponse, error) {
	return nil, unsupported(contract.OpFsWrite)
}

func (t *tiny) FsRead(context.Context, *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	return nil, nil, unsupported(contract.OpFsRead)
}

func (t *tiny) FsRm(context.Context, *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	return nil, unsupported(contract.OpFsRm)
}

func (t *tiny) FsChmod(context.Context, *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	return nil, unsupported(contract.OpFsChmod)
}

func (t *tiny) FsMv(context.Context, *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	return nil, unsupported(contract.OpFsMv)
}

func (t *tiny) FsGrep(context.Context, *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	return nil, unsupported(contract.OpFsGrep)
}

func (t *tiny) FsSed(context.Context, *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	return nil, unsupported(contract.OpFsSed)
}
