package mine

import (
	"context"
	"io"

	"github.com/iii-sandbox/iii/contract"
)

// The ten filesystem operations take the contract's requests unchanged
// and return S21x errors. The sandbox is a local directory, so fsops does
// all ten on its os.Root: "/" is the sandbox directory, relative paths are
// under /home, and ".." or a symbolic link cannot lead out (S215).

func (s *sandbox) FsLs(ctx context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	return s.tree.Ls(ctx, req)
}

func (s *sandbox) FsStat(ctx context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	return s.tree.Stat(ctx, req)
}

func (s *sandbox) FsMkdir(ctx context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	return s.tree.Mkdir(ctx, req)
}

func (s *sandbox) FsWrite(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	return s.tree.Write(ctx, req, content)
}

func (s *sandbox) FsRead(ctx context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	return s.tree.Read(ctx, req)
}

func (s *sandbox) FsRm(ctx context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	return s.tree.Rm(ctx, req)
}

func (s *sandbox) FsChmod(ctx context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	return s.tree.Chmod(ctx, req)
}

func (s *sandbox) FsMv(ctx context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	return s.tree.Mv(ctx, req)
}

func (s *sandbox) FsGrep(ctx context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	return s.tree.Grep(ctx, req)
}

func (s *sandbox) FsSed(ctx context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	return s.tree.Sed(ctx, req)
}
