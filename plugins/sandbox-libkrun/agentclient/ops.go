package agentclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// ExecRequest is one program to run in the guest.
type ExecRequest struct {
	Argv    []string
	Env     []string // "K=V"; PATH defaults to agentproto.DefaultPath
	Workdir string   // default "/"
	// Timeout kills the exec's whole process tree in the guest; 0 means
	// none (ctx still bounds the call).
	Timeout time.Duration
	// Stdin, when set, is streamed to the process and then closed.
	Stdin io.Reader
	// MaxOutputBytes caps each of stdout and stderr (default 1 MiB).
	MaxOutputBytes int64
}

// ExecResult is how an exec ended.
type ExecResult struct {
	PID             int
	Stdout, Stderr  []byte
	ExitCode        int // 127 not found, 126 not executable, 128+N signal N
	Signal          int
	TimedOut        bool
	StdoutTruncated bool
	StderrTruncated bool
	// Duration is measured in the guest, from fork to exit.
	Duration time.Duration
}

// Exec runs a program and collects its output. A missing or
// non-executable program is a result (exit 127/126), not an error. If ctx
// ends first, the agent kills the process tree and Exec returns ctx's error.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if len(req.Argv) > 0 && agentproto.IsBuiltin(req.Argv[0]) {
		// The agent serves these itself (freezing a worker's disk): only
		// the host's own calls (FreezeUpper, ThawUpper) may name them.
		return nil, contract.NewError(contract.S001, "argv[0] %q names an operation of the guest agent (%s…), which exec does not run", req.Argv[0], agentproto.BuiltinPrefix)
	}
	return c.exec(ctx, req)
}

// exec runs req as the agent sees it, built-ins included.
func (c *Client) exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if err := c.need(agentproto.CapExec, false); err != nil {
		return nil, err
	}
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = agentproto.DefaultMaxOutput
	}
	var (
		mu  sync.Mutex
		res ExecResult
	)
	onControl := func(m agentproto.Message) {
		if s, ok := m.(*agentproto.Started); ok {
			mu.Lock()
			res.PID = s.PID
			mu.Unlock()
		}
	}
	onData := func(st *stream, kind agentproto.Kind, p []byte) {
		mu.Lock()
		// The agent caps output itself; the host keeps its own cap so a
		// misbehaving guest cannot grow host memory.
		switch kind {
		case agentproto.KindStdout:
			res.Stdout = appendCapped(res.Stdout, p, limit, &res.StdoutTruncated)
		case agentproto.KindStderr:
			res.Stderr = appendCapped(res.Stderr, p, limit, &res.StderrTruncated)
		}
		mu.Unlock()
		st.grant(len(p))
	}
	st, err := c.open(&agentproto.ExecRequest{
		Argv: req.Argv, Env: req.Env, Workdir: req.Workdir,
		TimeoutMS:      req.Timeout.Milliseconds(),
		Stdin:          req.Stdin != nil,
		MaxOutputBytes: req.MaxOutputBytes,
	}, onControl, onData)
	if err != nil {
		return nil, err
	}
	if req.Stdin != nil {
		go func() {
			_, err := st.sendData(ctx, agentproto.KindStdin, req.Stdin)
			if err != nil && !errors.Is(err, errStreamEnded) && ctx.Err() == nil {
				// The host-side reader failed: the process sees the
				// input end there, as with a closed pipe.
				_ = c.write(agentproto.Frame{Kind: agentproto.KindStdin, Stream: st.id})
			}
		}()
	}
	m, err := st.wait(ctx)
	if err != nil {
		return nil, err
	}
	es, ok := m.(*agentproto.ExitStatus)
	if !ok {
		return nil, agentproto.Errorf(agentproto.CodeProtocol, "exec ended with %q", m.MessageType())
	}
	mu.Lock()
	defer mu.Unlock()
	out := res
	out.ExitCode = es.ExitCode
	out.Signal = es.Signal
	out.TimedOut = es.TimedOut
	out.StdoutTruncated = out.StdoutTruncated || es.StdoutTruncated
	out.StderrTruncated = out.StderrTruncated || es.StderrTruncated
	out.Duration = time.Duration(es.DurationUS) * time.Microsecond
	return &out, nil
}

func appendCapped(dst, p []byte, limit int64, truncated *bool) []byte {
	room := limit - int64(len(dst))
	if int64(len(p)) > room {
		*truncated = true
		if room <= 0 {
			return dst
		}
		p = p[:room]
	}
	return append(dst, p...)
}

// FS runs a filesystem operation that has no data stream (every op except
// write and read) and decodes its result into out.
func (c *Client) FS(ctx context.Context, req *agentproto.FSRequest, out any) error {
	if req.Op == agentproto.OpWrite || req.Op == agentproto.OpRead {
		return agentproto.Errorf(agentproto.CodeFSInvalid, "use WriteFile or ReadFile for fs %s", req.Op)
	}
	if err := c.need(agentproto.FSCapability(req.Op), true); err != nil {
		return err
	}
	st, err := c.open(req, nil, nil)
	if err != nil {
		return err
	}
	m, err := st.wait(ctx)
	if err != nil {
		return err
	}
	return decodeResult(m, out)
}

func decodeResult(m agentproto.Message, out any) error {
	r, ok := m.(*agentproto.Result)
	if !ok {
		return agentproto.Errorf(agentproto.CodeProtocol, "operation ended with %q", m.MessageType())
	}
	if out == nil || len(r.Body) == 0 {
		return nil
	}
	if err := json.Unmarshal(r.Body, out); err != nil {
		return agentproto.Errorf(agentproto.CodeProtocol, "decode %s result: %v", r.Op, err)
	}
	return nil
}

// Ls lists a directory.
func (c *Client) Ls(ctx context.Context, path string) (*agentproto.LsResult, error) {
	var res agentproto.LsResult
	return &res, c.FS(ctx, &agentproto.FSRequest{Op: agentproto.OpLs, Path: path}, &res)
}

// Stat describes a path (symlinks are not followed).
func (c *Client) Stat(ctx context.Context, path string) (*agentproto.FsEntry, error) {
	var res agentproto.FsEntry
	return &res, c.FS(ctx, &agentproto.FSRequest{Op: agentproto.OpStat, Path: path}, &res)
}

// Mkdir creates a directory; mode "" means "0755".
func (c *Client) Mkdir(ctx context.Context, path, mode string, parents bool) (*agentproto.MkdirResult, error) {
	var res agentproto.MkdirResult
	return &res, c.FS(ctx, &agentproto.FSRequest{Op: agentproto.OpMkdir, Path: path, Mode: mode, Parents: parents}, &res)
}

// Rm removes a path.
func (c *Client) Rm(ctx context.Context, path string, recursive bool) (*agentproto.RmResult, error) {
	var res agentproto.RmResult
	return &res, c.FS(ctx, &agentproto.FSRequest{Op: agentproto.OpRm, Path: path, Recursive: &recursive}, &res)
}

// Chmod changes a path's mode, and its owner when uid or gid is not nil.
func (c *Client) Chmod(ctx context.Context, req *agentproto.FSRequest) (*agentproto.ChmodResult, error) {
	r := *req
	r.Op = agentproto.OpChmod
	var res agentproto.ChmodResult
	return &res, c.FS(ctx, &r, &res)
}

// Mv renames a path.
func (c *Client) Mv(ctx context.Context, src, dst string, overwrite bool) (*agentproto.MvResult, error) {
	var res agentproto.MvResult
	return &res, c.FS(ctx, &agentproto.FSRequest{Op: agentproto.OpMv, Src: src, Dst: dst, Overwrite: overwrite}, &res)
}

// Grep searches files; see agentproto.FSRequest for the fields.
func (c *Client) Grep(ctx context.Context, req *agentproto.FSRequest) (*agentproto.GrepResult, error) {
	r := *req
	r.Op = agentproto.OpGrep
	var res agentproto.GrepResult
	return &res, c.FS(ctx, &r, &res)
}

// Sed replaces matches in files; see agentproto.FSRequest for the fields.
func (c *Client) Sed(ctx context.Context, req *agentproto.FSRequest) (*agentproto.SedResult, error) {
	r := *req
	r.Op = agentproto.OpSed
	var res agentproto.SedResult
	return &res, c.FS(ctx, &r, &res)
}

// WriteFile streams r into a file in the guest. req carries path, mode and
// parents. The guest writes a temporary file and renames it into place, so
// a failed or canceled write leaves the old file as it was.
func (c *Client) WriteFile(ctx context.Context, req *agentproto.FSRequest, r io.Reader) (*agentproto.WriteResult, error) {
	if err := c.need(agentproto.CapFSWrite, true); err != nil {
		return nil, err
	}
	wr := *req
	wr.Op = agentproto.OpWrite
	st, err := c.open(&wr, nil, nil)
	if err != nil {
		return nil, err
	}
	go func() {
		// The guest may answer before taking all the data (a missing
		// parent, say); the stream's window is then closed and this stops.
		_, err := st.sendData(ctx, agentproto.KindFile, r)
		if err != nil && !errors.Is(err, errStreamEnded) && ctx.Err() == nil {
			// Never let a failed source end as a short file: abort, and
			// the guest removes its temporary file.
			st.abort(agentproto.Errorf(agentproto.CodeFSAborted, "write %s: reading the content failed: %v", req.Path, err))
		}
	}()
	m, err := st.wait(ctx)
	if err != nil {
		return nil, err
	}
	var res agentproto.WriteResult
	return &res, decodeResult(m, &res)
}

// ReadFile opens a file in the guest for a streamed read. The reader
// returns the file's bytes, then io.EOF, or an *agentproto.Error if the
// read fails midway. Close it when done; closing early cancels the read.
func (c *Client) ReadFile(ctx context.Context, path string) (*agentproto.FileMeta, io.ReadCloser, error) {
	if err := c.need(agentproto.CapFSRead, true); err != nil {
		return nil, nil, err
	}
	fr := &fileReader{sig: make(chan struct{}, 1), meta: make(chan *agentproto.FileMeta, 1)}
	st, err := c.open(&agentproto.FSRequest{Op: agentproto.OpRead, Path: path},
		func(m agentproto.Message) {
			if meta, ok := m.(*agentproto.FileMeta); ok {
				select {
				case fr.meta <- meta:
				default:
				}
			}
		},
		func(_ *stream, kind agentproto.Kind, p []byte) {
			if kind == agentproto.KindFile {
				fr.push(p)
			}
		})
	if err != nil {
		return nil, nil, err
	}
	fr.st = st
	select {
	case meta := <-fr.meta:
		return meta, fr, nil
	case <-st.done:
		select {
		case meta := <-fr.meta:
			// Meta and a quick end arrived together: the reader
			// reports how it ended.
			return meta, fr, nil
		default:
		}
		// An error before any meta (missing file, a directory).
		if st.err != nil {
			return nil, nil, st.err
		}
		return nil, nil, agentproto.Errorf(agentproto.CodeProtocol, "read %s ended without metadata", path)
	case <-ctx.Done():
		st.cancel()
		return nil, nil, ctx.Err()
	}
}

// ReadFileTo copies a guest file into w and returns its metadata and size.
func (c *Client) ReadFileTo(ctx context.Context, path string, w io.Writer) (*agentproto.FileMeta, int64, error) {
	meta, r, err := c.ReadFile(ctx, path)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	stop := context.AfterFunc(ctx, func() { _ = r.Close() })
	defer stop()
	n, err := io.Copy(w, r)
	if err != nil {
		if ctx.Err() != nil {
			return meta, n, ctx.Err()
		}
		return meta, n, err
	}
	return meta, n, nil
}

// fileReader hands out the chunks of a streamed read. Credit goes back to
// the agent as the caller consumes bytes, so at most one window of data is
// buffered here however slowly the caller reads.
type fileReader struct {
	st   *stream
	meta chan *agentproto.FileMeta

	mu     sync.Mutex
	chunks [][]byte
	eof    bool
	closed bool
	sig    chan struct{}
	cur    []byte
	// owed is credit for consumed bytes not yet returned: grants go back
	// in batches of grantBatch. The agent never stalls on what is held
	// back: with its credit spent, at least InitialWindow-grantBatch bytes
	// are buffered or on their way here, so the reader goes on consuming
	// and grants again.
	owed int
}

// grantBatch is how many consumed bytes a streamed read collects before it
// returns them as credit. A grant is a frame the guest must read and act
// on, costly under an emulated CPU; a quarter of the window keeps the
// agent's sends flowing.
const grantBatch = agentproto.InitialWindow / 4

func (r *fileReader) push(p []byte) {
	r.mu.Lock()
	if len(p) == 0 {
		r.eof = true
	} else if !r.closed {
		r.chunks = append(r.chunks, p)
	}
	r.mu.Unlock()
	select {
	case r.sig <- struct{}{}:
	default:
	}
}

func (r *fileReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		r.mu.Lock()
		switch {
		case r.closed:
			r.mu.Unlock()
			return 0, io.ErrClosedPipe
		case len(r.chunks) > 0:
			r.cur = r.chunks[0]
			r.chunks[0] = nil
			r.chunks = r.chunks[1:]
			r.mu.Unlock()
			continue
		case r.eof:
			r.mu.Unlock()
			// The end-of-data frame precedes the terminal message;
			// wait for it so a late error is not lost.
			<-r.st.done
			if r.st.err != nil {
				return 0, r.st.err
			}
			return 0, io.EOF
		}
		r.mu.Unlock()
		select {
		case <-r.sig:
		case <-r.st.done:
			r.mu.Lock()
			pending := len(r.chunks) > 0 || r.eof
			r.mu.Unlock()
			if !pending {
				if r.st.err != nil {
					return 0, r.st.err
				}
				return 0, io.ErrUnexpectedEOF
			}
		}
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	r.owed += n
	if r.owed >= grantBatch {
		r.st.grant(r.owed)
		r.owed = 0
	}
	return n, nil
}

func (r *fileReader) Close() error {
	r.mu.Lock()
	already := r.closed
	r.closed = true
	r.chunks = nil
	r.mu.Unlock()
	if !already {
		r.st.cancel()
	}
	return nil
}

// ConfigureNetwork sets up the guest's eth0, default route and resolver.
func (c *Client) ConfigureNetwork(ctx context.Context, req agentproto.NetRequest) (*agentproto.NetResult, error) {
	if err := c.need(agentproto.CapNet, false); err != nil {
		return nil, err
	}
	st, err := c.open(&req, nil, nil)
	if err != nil {
		return nil, err
	}
	m, err := st.wait(ctx)
	if err != nil {
		return nil, err
	}
	var res agentproto.NetResult
	return &res, decodeResult(m, &res)
}

// NetStats reads the guest's traffic counters (protocol 1.2, capability
// net.stats) for ifname ("" is eth0).
func (c *Client) NetStats(ctx context.Context, ifname string) (*agentproto.NetStats, error) {
	if err := c.need(agentproto.CapNetStats, false); err != nil {
		return nil, err
	}
	st, err := c.open(&agentproto.NetStatsRequest{Interface: ifname}, nil, nil)
	if err != nil {
		return nil, err
	}
	m, err := st.wait(ctx)
	if err != nil {
		return nil, err
	}
	var res agentproto.NetStats
	return &res, decodeResult(m, &res)
}

// Reseed credits req.Seed to the guest's RNG and sets the guest's clock
// and host name when the request carries them (protocol 1.3, capability
// reseed).
func (c *Client) Reseed(ctx context.Context, req agentproto.ReseedRequest) (*agentproto.ReseedResult, error) {
	if err := c.need(agentproto.CapReseed, false); err != nil {
		return nil, err
	}
	st, err := c.open(&req, nil, nil)
	if err != nil {
		return nil, err
	}
	m, err := st.wait(ctx)
	if err != nil {
		return nil, err
	}
	var res agentproto.ReseedResult
	return &res, decodeResult(m, &res)
}

// Has reports whether the guest agent announced capability c.
func (c *Client) Has(capability string) bool { return c.hello.Has(capability) }

// Shutdown asks the agent to power the VM off. It returns once the agent
// has accepted; the VM process exits shortly after.
func (c *Client) Shutdown(ctx context.Context) error {
	if err := c.need(agentproto.CapShutdown, false); err != nil {
		return err
	}
	st, err := c.open(&agentproto.ShutdownRequest{}, nil, nil)
	if err != nil {
		return err
	}
	m, err := st.wait(ctx)
	if err != nil {
		return err
	}
	if _, ok := m.(*agentproto.Result); !ok {
		return fmt.Errorf("agentclient: shutdown ended with %q", m.MessageType())
	}
	return nil
}
