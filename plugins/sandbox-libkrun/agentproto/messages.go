package agentproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Message types, the "type" tag of a control message.
const (
	// Host → guest. The first message on a stream opens it.
	TypeExec     = "exec"
	TypeFS       = "fs"
	TypeNet      = "net"
	TypeShutdown = "shutdown"
	TypeCancel   = "cancel" // on an open stream: stop the operation
	// Protocol 1.1: worker VMs.
	TypeSpawn     = "spawn"     // a supervised process; streams like exec
	TypeProcStop  = "proc_stop" // stop a spawned process gracefully
	TypeWorkspace = "workspace" // a tar stream unpacked into a directory
	// Protocol 1.2: the reaper's view of network payload.
	TypeNetStats = "net_stats" // the guest's traffic counters
	// Protocol 1.3: a warm-pool VM made fresh when a sandbox claims it.
	TypeReseed = "reseed" // random bytes for the guest's RNG, the host's clock
	// Protocol 1.4: a kept process outlives its host connection.
	TypeProcAttach = "proc_attach" // stream a kept spawned process again
	// Guest → host.
	TypeStarted = "started" // exec: the process runs
	TypeExit    = "exit"    // exec: terminal
	TypeMeta    = "meta"    // fs read: size/mode/mtime before the data
	TypeResult  = "result"  // fs, net, shutdown: terminal
	TypeError   = "error"   // any operation: terminal
)

// Message is any control message.
type Message interface {
	MessageType() string
}

// ExecRequest runs one program. It is not a shell: argv is passed to execve
// as is, after argv[0] is looked up in the PATH of Env.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Env is the complete environment as "K=V" entries. When it has no PATH,
	// the agent adds DefaultPath.
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"` // default "/"
	// TimeoutMS kills the process group after this long; 0 means none.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin true means KindStdin frames follow (ended by an empty one);
	// false connects the process's standard input to /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// MaxOutputBytes caps each of stdout and stderr; 0 means
	// DefaultMaxOutput. Output past the cap is read and dropped.
	MaxOutputBytes int64 `json:"max_output_bytes,omitempty"`
}

// Exec defaults and limits.
const (
	DefaultPath      = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	DefaultMaxOutput = 1 << 20
	MaxOutputLimit   = 64 << 20
)

// Started reports the pid of an exec'd process.
type Started struct {
	PID int `json:"pid"`
	// DroppedBytes (proc_attach) is how much of the process's output was
	// lost while no host was attached: the oldest, past KeptOutputBytes.
	DroppedBytes int64 `json:"dropped_bytes,omitempty"`
}

// ExitStatus ends an exec stream. ExitCode follows the shell convention:
// 127 program not found, 126 not executable, 128+N killed by signal N.
type ExitStatus struct {
	ExitCode        int   `json:"exit_code"`
	Signal          int   `json:"signal,omitempty"`
	TimedOut        bool  `json:"timed_out,omitempty"`
	Canceled        bool  `json:"canceled,omitempty"`
	StdoutTruncated bool  `json:"stdout_truncated,omitempty"`
	StderrTruncated bool  `json:"stderr_truncated,omitempty"`
	DurationUS      int64 `json:"duration_us"` // fork to exit, measured in the guest
}

// FS operation names (FSRequest.Op), as in sandbox::fs::<op>.
const (
	OpLs    = "ls"
	OpStat  = "stat"
	OpMkdir = "mkdir"
	OpWrite = "write"
	OpRead  = "read"
	OpRm    = "rm"
	OpChmod = "chmod"
	OpMv    = "mv"
	OpGrep  = "grep"
	OpSed   = "sed"
)

// FSRequest is one filesystem operation: the union of every op's fields.
// Pointer fields are optional with op-specific defaults (recursive is true
// for grep and sed, false for rm and chmod).
type FSRequest struct {
	Op          string   `json:"op"`
	Path        string   `json:"path,omitempty"`
	Mode        string   `json:"mode,omitempty"` // octal, e.g. "0644"
	Parents     bool     `json:"parents,omitempty"`
	Recursive   *bool    `json:"recursive,omitempty"`
	UID         *int     `json:"uid,omitempty"`
	GID         *int     `json:"gid,omitempty"`
	Src         string   `json:"src,omitempty"`
	Dst         string   `json:"dst,omitempty"`
	Overwrite   bool     `json:"overwrite,omitempty"`
	Pattern     string   `json:"pattern,omitempty"`
	Replacement *string  `json:"replacement,omitempty"`
	Regex       *bool    `json:"regex,omitempty"`
	FirstOnly   bool     `json:"first_only,omitempty"`
	IgnoreCase  bool     `json:"ignore_case,omitempty"`
	IncludeGlob []string `json:"include_glob,omitempty"`
	ExcludeGlob []string `json:"exclude_glob,omitempty"`
	Files       []string `json:"files,omitempty"`
	// MaxMatches and MaxLineBytes bound grep; 0 means the default.
	MaxMatches   int `json:"max_matches,omitempty"`
	MaxLineBytes int `json:"max_line_bytes,omitempty"`
}

// grep defaults, from the sandbox contract.
const (
	DefaultMaxMatches   = 10000
	DefaultMaxLineBytes = 4096
)

// FileMeta precedes the data of an fs read.
type FileMeta struct {
	Size  int64  `json:"size"`
	Mode  string `json:"mode"`
	Mtime int64  `json:"mtime"`
}

// Result ends an fs, net or shutdown stream successfully. Body is the
// op-specific result (LsResult, FsEntry, ...).
type Result struct {
	Op   string          `json:"op,omitempty"`
	Body json.RawMessage `json:"body,omitempty"`
}

// NetRequest configures the guest's network. Empty fields take the QEMU
// user-network defaults.
type NetRequest struct {
	Interface string   `json:"interface,omitempty"` // default "eth0"
	Address   string   `json:"address,omitempty"`   // CIDR, default "10.0.2.15/24"
	Gateway   string   `json:"gateway,omitempty"`   // default "10.0.2.2"
	DNS       []string `json:"dns,omitempty"`       // default ["10.0.2.3"]
	Hostname  string   `json:"hostname,omitempty"`
}

// SpawnRequest starts a supervised, long-running process under Name (a
// worker's command, its install step). The stream carries Started, then
// the process's output as KindStdout and KindStderr frames with no size
// cap (flow control is the only brake: a host that stops granting credit
// stalls the process's writes), and ends with ExitStatus when the process
// has exited and its output is drained. ProcStop on another stream stops
// it gracefully; Cancel on this stream, or the connection ending, kills
// its process group at once.
type SpawnRequest struct {
	Name    string   `json:"name"`
	Argv    []string `json:"argv"`
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"` // default "/"
	// Keep (protocol 1.4, CapProcAttach) lets the process outlive this
	// stream and the connection: when either ends the process goes on,
	// its output kept (the last KeptOutputBytes) until a ProcAttach on a
	// later connection streams it again. Only Cancel on this stream or
	// ProcStop ends it.
	Keep bool `json:"keep,omitempty"`
}

// ProcStopRequest stops the spawned process Name: SIGTERM to its process
// group, then SIGKILL to everything it started after GraceMS. The reply
// (Result with a ProcStopResult) comes once the process is gone.
type ProcStopRequest struct {
	Name    string `json:"name"`
	GraceMS int64  `json:"grace_ms,omitempty"`
}

// WorkspaceRequest unpacks a tar stream (KindFile frames, ended by an empty
// one) into Dir, creating it. Regular files, directories and symbolic links
// are written (owned by root, permission bits only); other entries are
// skipped. Nothing is ever written through a symbolic link: a link or file
// where the archive has a directory is replaced. With Prune, entries under
// Dir that the archive does not hold are removed afterwards, except those
// named in Keep (at any depth) or in KeepTop (directly in Dir, e.g.
// node_modules, which belongs to the guest's install step) and everything
// below them.
type WorkspaceRequest struct {
	Dir     string   `json:"dir"`
	Prune   bool     `json:"prune,omitempty"`
	Keep    []string `json:"keep,omitempty"`
	KeepTop []string `json:"keep_top,omitempty"`
}

// NetStatsRequest asks for the guest's traffic counters (NetStats in the
// Result), which the host samples to tell relayed payload from silence.
type NetStatsRequest struct {
	Interface string `json:"interface,omitempty"` // default "eth0"
}

// MaxReseedBytes bounds a reseed's seed.
const MaxReseedBytes = 512

// ReseedRequest credits Seed (random bytes from the host) to the guest
// kernel's RNG and reseeds it at once; when UnixNano is set, it sets the
// guest's clock to it, and when Hostname is set, the host name. A VM
// booted ahead of its use (a warm pool) gets one when it is claimed, and a
// VM restored from a snapshot template, whose RNG state every sibling
// shares, as soon as it runs.
type ReseedRequest struct {
	Seed     []byte `json:"seed"`
	UnixNano int64  `json:"unix_nano,omitempty"`
	Hostname string `json:"hostname,omitempty"`
}

// ReseedResult is a reseed's Result body.
type ReseedResult struct {
	SeedBytes int  `json:"seed_bytes"`
	ClockSet  bool `json:"clock_set"`
	// Reseeded is true when the kernel's CRNG was reseeded at once
	// (RNDRESEEDCRNG); false when the seed was only mixed in.
	Reseeded    bool `json:"reseeded,omitempty"`
	HostnameSet bool `json:"hostname_set,omitempty"`
}

// ShutdownRequest powers the VM off once the guest has replied.
type ShutdownRequest struct{}

// Cancel asks the guest to stop the operation on this stream. An exec's
// process group is killed; the stream still ends with its terminal message.
type Cancel struct{}

// Op-specific result bodies. Field names follow the sandbox contract.
type (
	FsEntry struct {
		Name      string `json:"name"`
		IsDir     bool   `json:"is_dir"`
		Size      int64  `json:"size"`
		Mode      string `json:"mode"`
		Mtime     int64  `json:"mtime"`
		IsSymlink bool   `json:"is_symlink"`
	}
	LsResult struct {
		Entries []FsEntry `json:"entries"`
	}
	MkdirResult struct {
		Created bool `json:"created"`
	}
	WriteResult struct {
		BytesWritten int64  `json:"bytes_written"`
		Path         string `json:"path"`
	}
	ReadResult struct {
		BytesRead int64 `json:"bytes_read"`
	}
	RmResult struct {
		Removed bool `json:"removed"`
	}
	ChmodResult struct {
		Updated int64 `json:"updated"`
	}
	MvResult struct {
		Moved bool `json:"moved"`
	}
	GrepMatch struct {
		Path    string `json:"path"`
		Line    int    `json:"line"`
		Content string `json:"content"`
	}
	GrepResult struct {
		Matches   []GrepMatch `json:"matches"`
		Truncated bool        `json:"truncated"`
	}
	SedFileResult struct {
		Path         string `json:"path"`
		Replacements int    `json:"replacements"`
		Success      bool   `json:"success"`
		Error        string `json:"error,omitempty"`
	}
	SedResult struct {
		Results           []SedFileResult `json:"results"`
		TotalReplacements int             `json:"total_replacements"`
	}
	NetResult struct {
		Interface string `json:"interface"`
		Address   string `json:"address"`
	}
	// NetStats are the guest kernel's traffic counters since boot: the
	// protocol counters of /proc/net/snmp and /proc/net/netstat (for
	// the whole guest, loopback included) and the packet counters of
	// one interface. The counters that count payload are TCP segments
	// with original data sent, TCP segments received that were not pure
	// ACKs, and UDP datagrams both ways, over IPv4 and IPv6 (DNS
	// included); see Payload.
	NetStats struct {
		TCPInSegs       uint64 `json:"tcp_in_segs"`
		TCPPureAcks     uint64 `json:"tcp_pure_acks"`
		TCPHPAcks       uint64 `json:"tcp_hp_acks"`
		TCPOrigDataSent uint64 `json:"tcp_orig_data_sent"`
		UDPInDatagrams  uint64 `json:"udp_in_datagrams"`
		UDPOutDatagrams uint64 `json:"udp_out_datagrams"`
		// From /proc/net/snmp6; zero without IPv6.
		UDP6InDatagrams  uint64 `json:"udp6_in_datagrams,omitempty"`
		UDP6OutDatagrams uint64 `json:"udp6_out_datagrams,omitempty"`
		Interface        string `json:"interface"`
		IfRxPackets      uint64 `json:"if_rx_packets"`
		IfTxPackets      uint64 `json:"if_tx_packets"`
	}
	// ProcStopResult: Stopped is false when no process ran under the
	// name; Killed says the grace ran out and SIGKILL was needed.
	ProcStopResult struct {
		Stopped bool `json:"stopped"`
		Killed  bool `json:"killed,omitempty"`
	}
	WorkspaceResult struct {
		Files    int64 `json:"files"`
		Dirs     int64 `json:"dirs"`
		Symlinks int64 `json:"symlinks"`
		Bytes    int64 `json:"bytes"`
		Skipped  int64 `json:"skipped,omitempty"`
		Removed  int64 `json:"removed,omitempty"`
	}
)

func (*ExecRequest) MessageType() string      { return TypeExec }
func (*FSRequest) MessageType() string        { return TypeFS }
func (*NetRequest) MessageType() string       { return TypeNet }
func (*ShutdownRequest) MessageType() string  { return TypeShutdown }
func (*SpawnRequest) MessageType() string     { return TypeSpawn }
func (*ProcStopRequest) MessageType() string  { return TypeProcStop }
func (*WorkspaceRequest) MessageType() string { return TypeWorkspace }
func (*NetStatsRequest) MessageType() string  { return TypeNetStats }
func (*ReseedRequest) MessageType() string    { return TypeReseed }
func (*Cancel) MessageType() string           { return TypeCancel }
func (*Started) MessageType() string          { return TypeStarted }
func (*ExitStatus) MessageType() string       { return TypeExit }
func (*FileMeta) MessageType() string         { return TypeMeta }
func (*Result) MessageType() string           { return TypeResult }
func (*Error) MessageType() string            { return TypeError }

// ErrUnknownMessage is wrapped by DecodeMessage for a well-formed message
// whose type this version does not know.
var ErrUnknownMessage = errors.New("unknown message type")

// EncodeMessage returns the JSON of m with its "type" tag first.
func EncodeMessage(m Message) ([]byte, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("agentproto: encode %s: %w", m.MessageType(), err)
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("agentproto: encode %s: not a JSON object", m.MessageType())
	}
	tag, _ := json.Marshal(m.MessageType())
	out := make([]byte, 0, len(body)+len(tag)+10)
	out = append(out, `{"type":`...)
	out = append(out, tag...)
	if len(body) > 2 {
		out = append(out, ',')
	}
	return append(out, body[1:]...), nil
}

// DecodeMessage parses one control message. Unknown fields are ignored so a
// newer minor can add them.
func DecodeMessage(p []byte) (Message, error) {
	if t, ok := leadingType(p); ok {
		// One pass instead of two: the second decode below checks the
		// whole message anyway. Whatever it refuses goes the long way,
		// so errors read the same either way.
		if m, err := decodeTyped(p, t); err == nil {
			return m, nil
		}
	}
	var env struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(p, &env); err != nil {
		return nil, fmt.Errorf("agentproto: decode message: %w", err)
	}
	if env.Type == nil {
		return nil, errors.New(`agentproto: decode message: no "type"`)
	}
	return decodeTyped(p, *env.Type)
}

// leadingType reads the type tag where EncodeMessage puts it, first and
// plainly spelled ({"type":"exec",...}), when no other key can be read as
// "type": encoding/json matches keys without regard to case and takes the
// last of duplicates, so a message with anything like another "type" in
// it, an escape or a non-ASCII byte (Unicode case folding) is left to the
// full decode.
func leadingType(p []byte) (string, bool) {
	const prefix = `{"type":"`
	if !bytes.HasPrefix(p, []byte(prefix)) {
		return "", false
	}
	rest := p[len(prefix):]
	end := bytes.IndexByte(rest, '"')
	if end <= 0 {
		return "", false
	}
	for _, c := range rest[:end] {
		if (c < 'a' || c > 'z') && c != '_' {
			return "", false
		}
	}
	after := rest[end+1:]
	for i, c := range after {
		if c == '\\' || c >= 0x80 {
			return "", false
		}
		// ASCII letters only differ in case by bit 0x20.
		if c|0x20 == 't' && i+4 <= len(after) && after[i+1]|0x20 == 'y' && after[i+2]|0x20 == 'p' && after[i+3]|0x20 == 'e' {
			return "", false
		}
	}
	return string(rest[:end]), true
}

// decodeTyped decodes p as the message of type t.
func decodeTyped(p []byte, t string) (Message, error) {
	var m Message
	switch t {
	case TypeExec:
		m = &ExecRequest{}
	case TypeFS:
		m = &FSRequest{}
	case TypeNet:
		m = &NetRequest{}
	case TypeShutdown:
		m = &ShutdownRequest{}
	case TypeSpawn:
		m = &SpawnRequest{}
	case TypeProcStop:
		m = &ProcStopRequest{}
	case TypeProcAttach:
		m = &ProcAttachRequest{}
	case TypeWorkspace:
		m = &WorkspaceRequest{}
	case TypeNetStats:
		m = &NetStatsRequest{}
	case TypeReseed:
		m = &ReseedRequest{}
	case TypeCancel:
		m = &Cancel{}
	case TypeStarted:
		m = &Started{}
	case TypeExit:
		m = &ExitStatus{}
	case TypeMeta:
		m = &FileMeta{}
	case TypeResult:
		m = &Result{}
	case TypeError:
		m = &Error{}
	default:
		return nil, fmt.Errorf("agentproto: %w %q", ErrUnknownMessage, t)
	}
	if err := json.Unmarshal(p, m); err != nil {
		return nil, fmt.Errorf("agentproto: decode %s: %w", t, err)
	}
	if err := validate(m); err != nil {
		return nil, fmt.Errorf("agentproto: decode %s: %w", t, err)
	}
	return m, nil
}

// validate checks what every receiver needs to be true; op-specific rules
// (which fields an fs op requires) are checked where the op runs, so the
// reply can carry the op's own error code.
func validate(m Message) error {
	switch m := m.(type) {
	case *ExecRequest:
		if err := validArgvEnv(m.Argv, m.Env); err != nil {
			return err
		}
		if m.TimeoutMS < 0 {
			return errors.New("timeout_ms is negative")
		}
		if m.MaxOutputBytes < 0 || m.MaxOutputBytes > MaxOutputLimit {
			return fmt.Errorf("max_output_bytes must be between 0 and %d", MaxOutputLimit)
		}
	case *SpawnRequest:
		if !ValidProcName(m.Name) {
			return fmt.Errorf("process name %q: want 1 to 64 of a-z 0-9 . _ -", m.Name)
		}
		if err := validArgvEnv(m.Argv, m.Env); err != nil {
			return err
		}
	case *ProcAttachRequest:
		if !ValidProcName(m.Name) {
			return fmt.Errorf("process name %q: want 1 to 64 of a-z 0-9 . _ -", m.Name)
		}
	case *ProcStopRequest:
		if !ValidProcName(m.Name) {
			return fmt.Errorf("process name %q: want 1 to 64 of a-z 0-9 . _ -", m.Name)
		}
		if m.GraceMS < 0 {
			return errors.New("grace_ms is negative")
		}
	case *WorkspaceRequest:
		if !strings.HasPrefix(m.Dir, "/") || path.Clean(m.Dir) != m.Dir || m.Dir == "/" {
			return fmt.Errorf("workspace dir %q must be a clean absolute path other than /", m.Dir)
		}
		for _, k := range append(slices.Clip(m.Keep), m.KeepTop...) {
			if k == "" || k == "." || k == ".." || strings.ContainsAny(k, "/\x00") {
				return fmt.Errorf("keep entry %q is not a plain name", k)
			}
		}
	case *ReseedRequest:
		if len(m.Seed) == 0 || len(m.Seed) > MaxReseedBytes {
			return fmt.Errorf("seed must hold 1 to %d bytes, got %d", MaxReseedBytes, len(m.Seed))
		}
		if m.UnixNano < 0 {
			return fmt.Errorf("unix_nano %d is before 1970", m.UnixNano)
		}
		if m.Hostname != "" && !hostnameRe.MatchString(m.Hostname) {
			return fmt.Errorf("hostname %q is not a host name", m.Hostname)
		}
	case *NetStatsRequest:
		if m.Interface != "" && !validIfName(m.Interface) {
			return fmt.Errorf("interface %q is not an interface name", m.Interface)
		}
	case *FSRequest:
		if m.Op == "" {
			return errors.New("op is empty")
		}
		if m.MaxMatches < 0 || m.MaxLineBytes < 0 {
			return errors.New("max_matches and max_line_bytes must not be negative")
		}
	case *Started:
		if m.PID <= 0 {
			return errors.New("pid must be positive")
		}
	case *Error:
		if m.Code == "" {
			return errors.New("error without a code")
		}
	}
	return nil
}

// EncodeControl encodes m as the frames that carry it on stream: one
// KindControl frame, or KindControlPart frames closed by a KindControl frame
// when the JSON is larger than MaxPayload.
func EncodeControl(stream uint32, m Message) ([]Frame, error) {
	p, err := EncodeMessage(m)
	if err != nil {
		return nil, err
	}
	if len(p) > MaxMessage {
		return nil, ErrMessageTooBig
	}
	var frames []Frame
	for len(p) > MaxPayload {
		frames = append(frames, Frame{Kind: KindControlPart, Stream: stream, Payload: p[:MaxPayload]})
		p = p[MaxPayload:]
	}
	return append(frames, Frame{Kind: KindControl, Stream: stream, Payload: p}), nil
}

// Assembler joins KindControlPart frames with the KindControl frame that
// ends them, per stream.
type Assembler struct {
	parts map[uint32][]byte
	total int
}

// Add takes a control or control-part frame. It returns the whole message
// when f completes one.
func (a *Assembler) Add(f Frame) (msg []byte, done bool, err error) {
	if f.Kind != KindControl && f.Kind != KindControlPart {
		return nil, false, fmt.Errorf("agentproto: %s frame given to the control assembler", f.Kind)
	}
	prev, ok := a.parts[f.Stream]
	if !ok && f.Kind == KindControl {
		return f.Payload, true, nil
	}
	if len(prev)+len(f.Payload) > MaxMessage || a.total+len(f.Payload) > 2*MaxMessage {
		a.Drop(f.Stream)
		return nil, false, ErrMessageTooBig
	}
	buf := append(prev, f.Payload...)
	if f.Kind == KindControlPart {
		if a.parts == nil {
			a.parts = make(map[uint32][]byte)
		}
		a.parts[f.Stream] = buf
		a.total += len(f.Payload)
		return nil, false, nil
	}
	a.Drop(f.Stream)
	return buf, true, nil
}

// Drop forgets a partial message, when its stream is reset.
func (a *Assembler) Drop(stream uint32) {
	if p, ok := a.parts[stream]; ok {
		a.total -= len(p)
		delete(a.parts, stream)
	}
}

func validArgvEnv(argv, env []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return errors.New("argv is empty")
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errors.New("argv holds a NUL byte")
		}
	}
	for _, e := range env {
		if i := strings.IndexByte(e, '='); i <= 0 {
			return fmt.Errorf("env entry %q is not K=V", e)
		}
		if strings.IndexByte(e, 0) >= 0 {
			return errors.New("env holds a NUL byte")
		}
	}
	return nil
}

// ValidProcName reports whether name may name a spawned process.
func ValidProcName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Payload is the sum of the counters that move with payload: TCP segments
// with original data sent, TCP segments received minus the pure ACKs the
// kernel counted (fast and slow path), UDP datagrams in and out. Bare
// ACKs and our own keepalive probes leave it unchanged; see the adapter's
// documentation for what else can move it.
func (n NetStats) Payload() uint64 {
	in := n.TCPInSegs
	acks := n.TCPPureAcks + n.TCPHPAcks
	if acks > in {
		in = 0
	} else {
		in -= acks
	}
	return n.TCPOrigDataSent + in + n.UDPInDatagrams + n.UDPOutDatagrams + n.UDP6InDatagrams + n.UDP6OutDatagrams
}

// validIfName: what Linux accepts as an interface name (at most 15 bytes,
// no '/', no whitespace, not "." or "..").
func validIfName(s string) bool {
	if len(s) == 0 || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if r == '/' || r == ':' || r <= ' ' || r > '~' {
			return false
		}
	}
	return true
}
