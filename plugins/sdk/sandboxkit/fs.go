package sandboxkit

import (
	"context"
	"io"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// The filesystem operations all take the same path through the Manager:
// find the live sandbox (S002/S004), count the operation in flight so the
// reaper leaves the sandbox alone, bump the idle clock before and after,
// and report any error that is not already an S-code as S216.

// fsOp runs one filesystem operation on a live sandbox.
func fsOp[Req, Resp any](ctx context.Context, m *Manager, id string, req *Req,
	call func(Sandbox) func(context.Context, *Req) (*Resp, error),
) (*Resp, error) {
	e, ce := m.acquire(id, false)
	if ce != nil {
		return nil, ce
	}
	defer m.release(e, false)
	out, err := call(e.sb)(ctx, req)
	if err != nil {
		return nil, m.opError(ctx, e, err, contract.S216)
	}
	if out == nil {
		return nil, contract.NewError(contract.S216, "the sandbox back end returned no reply")
	}
	return out, nil
}

// FsLs serves fs::ls.
func (m *Manager) FsLs(ctx context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	return fsOp(ctx, m, req.SandboxID, req, func(s Sandbox) func(context.Context, *contract.FsLsRequest) (*contract.FsLsResponse, error) {
		return s.FsLs
	})
}

// FsStat serves fs::stat.
func (m *Manager) FsStat(ctx context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	return fsOp(ctx, m, req.SandboxID, req, func(s Sandbox) func(context.Context, *contract.FsStatRequest) (*contract.FsEntry, error) {
		return s.FsStat
	})
}

// FsMkdir serves fs::mkdir.
func (m *Manager) FsMkdir(ctx context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	return fsOp(ctx, m, req.SandboxID, req, func(s Sandbox) func(context.Context, *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
		return s.FsMkdir
	})
}

// FsRm serves fs::rm.
func (m *Manager) FsRm(ctx context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	return fsOp(ctx, m, req.SandboxID, req, func(s Sandbox) func(context.Context, *contract.FsRmRequest) (*contract.FsRmResponse, error) {
		return s.FsRm
	})
}

// FsChmod serves fs::chmod.
func (m *Manager) FsChmod(ctx context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	return fsOp(ctx, m, req.SandboxID, req, func(s Sandbox) func(context.Context, *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
		return s.FsChmod
	})
}

// FsMv serves fs::mv.
func (m *Manager) FsMv(ctx context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	return fsOp(ctx, m, req.SandboxID, req, func(s Sandbox) func(context.Context, *contract.FsMvRequest) (*contract.FsMvResponse, error) {
		return s.FsMv
	})
}

// FsGrep serves fs::grep.
func (m *Manager) FsGrep(ctx context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	return fsOp(ctx, m, req.SandboxID, req, func(s Sandbox) func(context.Context, *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
		return s.FsGrep
	})
}

// FsSed serves fs::sed.
func (m *Manager) FsSed(ctx context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	return fsOp(ctx, m, req.SandboxID, req, func(s Sandbox) func(context.Context, *contract.FsSedRequest) (*contract.FsSedResponse, error) {
		return s.FsSed
	})
}

// FsWrite serves fs::write.
func (m *Manager) FsWrite(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	e, ce := m.acquire(req.SandboxID, false)
	if ce != nil {
		return nil, ce
	}
	defer m.release(e, false)
	if content == nil {
		content = eofReader{}
	}
	// A long upload is activity: each chunk bumps the idle clock.
	out, err := e.sb.FsWrite(ctx, req, &touchingReader{r: content, e: e, now: m.now})
	if err != nil {
		return nil, m.opError(ctx, e, err, contract.S216)
	}
	if out == nil {
		return nil, contract.NewError(contract.S216, "the sandbox back end returned no reply")
	}
	return out, nil
}

// FsRead serves fs::read. The file's bytes are read after FsRead returns;
// reading them bumps the idle clock so a long download is not reaped.
func (m *Manager) FsRead(ctx context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	e, ce := m.acquire(req.SandboxID, false)
	if ce != nil {
		return nil, nil, ce
	}
	defer m.release(e, false)
	meta, body, err := e.sb.FsRead(ctx, req)
	if err != nil {
		if body != nil {
			_ = body.Close()
		}
		return nil, nil, m.opError(ctx, e, err, contract.S216)
	}
	if meta == nil || body == nil {
		if body != nil {
			_ = body.Close()
		}
		return nil, nil, contract.NewError(contract.S216, "the sandbox back end returned no reply")
	}
	return meta, &touchingReadCloser{touchingReader: touchingReader{r: body, e: e, now: m.now}, c: body}, nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

type touchingReader struct {
	r   io.Reader
	e   *entry
	now func() time.Time
}

func (t *touchingReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.e.touch(t.now())
	}
	return n, err
}

type touchingReadCloser struct {
	touchingReader
	c io.Closer
}

func (t *touchingReadCloser) Close() error { return t.c.Close() }
