package agentproto

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Protocol version. A change of major means the peers cannot talk; a change
// of minor adds messages or fields that older peers ignore, and capabilities
// tell which operations a guest serves.
const (
	ProtocolMajor = 1
	ProtocolMinor = 4
)

// Sizes of the framing layer.
const (
	// HeaderSize is the fixed frame header: length, kind, stream id.
	HeaderSize = 9
	// MaxPayload bounds one frame so a reader never allocates more than this
	// for a frame, whatever the length field says.
	MaxPayload = 1 << 20
	// MaxMessage bounds a control message reassembled from parts (a grep
	// result with many matches, a large directory listing).
	MaxMessage = 64 << 20
	// ChunkSize is the size of the data frames senders produce. Smaller
	// chunks interleave better between streams; larger ones cost fewer
	// syscalls on the virtio port, which hands out 4 KiB per read anyway.
	ChunkSize = 64 << 10
	// FileChunkSize is the size of the data frames of a file write (host
	// to guest). Every peer reads frames up to MaxPayload, so this is the
	// sender's choice: the guest's work per byte under an emulated CPU
	// falls with fewer, larger frames (and fewer window grants back),
	// and a file's bytes are not latency-sensitive as a terminal's are.
	FileChunkSize = 256 << 10
	// InitialWindow is each stream's send credit per direction for data
	// frames. Both sides assume it; KindWindow frames add to it.
	InitialWindow = 1 << 20
	// MaxResyncBytes bounds how many stray bytes a reader skips while
	// looking for Magic at the start of a connection.
	MaxResyncBytes = 2*MaxPayload + 2*HeaderSize
)

// Magic precedes every KindHello frame. Its first byte is not valid UTF-8
// and not a plausible length prefix, so it is unlikely at a frame boundary.
const Magic = "\xa5iiiAGT\x5a"

// Kind says what a frame's payload is.
type Kind uint8

// Frame kinds. Receivers ignore kinds they do not know (a newer minor may add
// some), except inside a control message being reassembled.
const (
	// KindHello carries a Hello as JSON, on stream 0, after Magic.
	KindHello Kind = 0x01
	// KindControl carries a control message (JSON tagged by "type"), or the
	// last part of one that began with KindControlPart frames.
	KindControl Kind = 0x02
	// KindControlPart carries a leading part of a control message.
	KindControlPart Kind = 0x03
	// KindWindow returns send credit for data frames: payload is a u32.
	KindWindow Kind = 0x04
	// KindStdin carries bytes for a process's standard input (host → guest).
	KindStdin Kind = 0x10
	// KindStdout carries a process's standard output (guest → host).
	KindStdout Kind = 0x11
	// KindStderr carries a process's standard error (guest → host).
	KindStderr Kind = 0x12
	// KindFile carries file contents (fs write: host → guest; fs read:
	// guest → host).
	KindFile Kind = 0x13
)

// IsData reports whether frames of this kind carry raw, flow-controlled
// bytes. An empty data frame closes its channel and costs no credit.
func (k Kind) IsData() bool {
	switch k {
	case KindStdin, KindStdout, KindStderr, KindFile:
		return true
	}
	return false
}

func (k Kind) String() string {
	switch k {
	case KindHello:
		return "hello"
	case KindControl:
		return "control"
	case KindControlPart:
		return "control-part"
	case KindWindow:
		return "window"
	case KindStdin:
		return "stdin"
	case KindStdout:
		return "stdout"
	case KindStderr:
		return "stderr"
	case KindFile:
		return "file"
	}
	return fmt.Sprintf("kind(0x%02x)", uint8(k))
}

// Frame is one unit on the wire.
type Frame struct {
	Kind    Kind
	Stream  uint32
	Payload []byte
}

// Framing errors. They are fatal for the connection: after one, the byte
// stream cannot be trusted to be at a frame boundary.
var (
	ErrFrameTooLarge = errors.New("agentproto: frame payload exceeds MaxPayload")
	ErrMessageTooBig = errors.New("agentproto: control message exceeds MaxMessage")
	ErrNoMagic       = errors.New("agentproto: no hello magic within the resync limit")
)

// AppendFrame appends the wire form of f to dst. It fails only when the
// payload is larger than MaxPayload.
func AppendFrame(dst []byte, f Frame) ([]byte, error) {
	if len(f.Payload) > MaxPayload {
		return dst, ErrFrameTooLarge
	}
	dst = AppendHeader(dst, f.Kind, f.Stream, len(f.Payload))
	return append(dst, f.Payload...), nil
}

// AppendHeader appends the header of a frame of kind on stream whose
// payload is n bytes, for senders that write the payload from its own
// buffer (one writev) instead of copying it after the header. n must not
// exceed MaxPayload.
func AppendHeader(dst []byte, kind Kind, stream uint32, n int) []byte {
	var h [HeaderSize]byte
	binary.BigEndian.PutUint32(h[0:4], uint32(n))
	h[4] = byte(kind)
	binary.BigEndian.PutUint32(h[5:9], stream)
	return append(dst, h[:]...)
}

// WriteFrame writes f with one Write call, so that writers serialised by a
// mutex never interleave partial frames.
func WriteFrame(w io.Writer, f Frame) error {
	b, err := AppendFrame(make([]byte, 0, HeaderSize+len(f.Payload)), f)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadFrame reads one frame. It returns io.EOF only when r ends cleanly at a
// frame boundary, and io.ErrUnexpectedEOF when it ends inside a frame.
func ReadFrame(r io.Reader) (Frame, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(h[0:4])
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	f := Frame{Kind: Kind(h[4]), Stream: binary.BigEndian.Uint32(h[5:9])}
	if n > 0 {
		f.Payload = make([]byte, n)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, err
		}
	}
	return f, nil
}

// AtMagic reports whether r's next byte is Magic's first, without
// consuming it: a frame never starts there (its length prefix is below
// MaxPayload), so the peer has started over with a new hello. It waits for
// the next byte like a read does; on a read error it reports false and
// leaves the error to the next read.
func AtMagic(r *bufio.Reader) bool {
	b, err := r.Peek(1)
	return err == nil && b[0] == Magic[0]
}

// SkipToMagic consumes bytes from r up to and including Magic. Bytes before
// it are the tail of a frame from a previous connection; more than
// MaxResyncBytes of them means the peer is not speaking this protocol.
func SkipToMagic(r *bufio.Reader) error {
	matched := 0
	for skipped := 0; ; skipped++ {
		if skipped > MaxResyncBytes+len(Magic) {
			return ErrNoMagic
		}
		b, err := r.ReadByte()
		if err != nil {
			return err
		}
		switch {
		case b == Magic[matched]:
			matched++
			if matched == len(Magic) {
				return nil
			}
		case b == Magic[0]:
			// Magic's first byte occurs nowhere else in it, so a
			// mismatch can only restart the match at this byte.
			matched = 1
		default:
			matched = 0
		}
	}
}

// WindowPayload encodes a credit grant for a KindWindow frame.
func WindowPayload(n uint32) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	return b[:]
}

// ParseWindow decodes a KindWindow payload.
func ParseWindow(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("agentproto: window frame with %d-byte payload, want 4", len(p))
	}
	n := binary.BigEndian.Uint32(p)
	if n == 0 || n > InitialWindow {
		return 0, fmt.Errorf("agentproto: window grant %d out of range", n)
	}
	return n, nil
}

// FrameBuffered reports whether br already holds the whole next frame, so
// that reading it makes no read on br's source (which may block).
func FrameBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n < HeaderSize {
		return false
	}
	h, err := br.Peek(HeaderSize)
	if err != nil {
		return false
	}
	return int64(n) >= HeaderSize+int64(binary.BigEndian.Uint32(h[0:4]))
}

// ReadFrameBuffered is ReadFrame for a buffered reader. When the header
// announces an oversized payload it consumes nothing, so the caller can
// resynchronise with SkipToMagic from that very byte: a new connection's
// Magic read as a header looks exactly like that.
func ReadFrameBuffered(br *bufio.Reader) (Frame, error) {
	h, err := br.Peek(HeaderSize)
	if err != nil {
		if errors.Is(err, io.EOF) && len(h) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	if n := binary.BigEndian.Uint32(h[0:4]); n > MaxPayload {
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	return ReadFrame(br)
}
