package agentproto

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ptr[T any](v T) *T { return &v }

// goldenFrames is one conversation: each entry becomes testdata/<name>.bin.
// The files pin the wire format; a change that alters them breaks guests
// built from an older tree.
func goldenFrames() []struct {
	name   string
	frames []Frame
} {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	ctl := func(stream uint32, m Message) []Frame {
		f, err := EncodeControl(stream, m)
		must(err)
		return f
	}
	hello := func(h Hello) []Frame {
		p, err := json.Marshal(h)
		must(err)
		return []Frame{{Kind: KindHello, Payload: p}}
	}
	return []struct {
		name   string
		frames []Frame
	}{
		{"hello-host", hello(Hello{Role: RoleHost, ProtocolMajor: 1, ProtocolMinor: 0, Nonce: "n1", Version: "0.26.0"})},
		{"hello-agent", hello(Hello{Role: RoleAgent, ProtocolMajor: 1, ProtocolMinor: 0, Nonce: "n1", Version: "0.26.0",
			Capabilities: []string{CapExec, CapFSRead}, Arch: "amd64", Root: "overlay", UptimeMS: 1500, BootMS: 1400})},
		{"exec", append(ctl(1, &ExecRequest{Argv: []string{"/bin/sh", "-c", "cat"}, Env: []string{"PATH=/bin"}, Workdir: "/tmp", TimeoutMS: 5000, Stdin: true}),
			Frame{Kind: KindStdin, Stream: 1, Payload: []byte("hi\n")},
			Frame{Kind: KindStdin, Stream: 1})},
		{"exec-reply", append(ctl(1, &Started{PID: 42}),
			Frame{Kind: KindStdout, Stream: 1, Payload: []byte("hi\n")},
			Frame{Kind: KindWindow, Stream: 1, Payload: WindowPayload(3)},
			ctl(1, &ExitStatus{ExitCode: 137, Signal: 9, TimedOut: true, StdoutTruncated: true, DurationUS: 1234})[0])},
		{"fs-mkdir", ctl(3, &FSRequest{Op: OpMkdir, Path: "/a/b", Mode: "0755", Parents: true})},
		{"fs-error", ctl(3, &Error{Code: CodeFSNotFound, Message: "parent directory not found: /a", ParentMissing: true})},
		{"fs-read-reply", append(ctl(5, &FileMeta{Size: 5, Mode: "0644", Mtime: 1700000000}),
			Frame{Kind: KindFile, Stream: 5, Payload: []byte("hello")},
			Frame{Kind: KindFile, Stream: 5},
			ctl(5, &Result{Op: OpRead, Body: json.RawMessage(`{"bytes_read":5}`)})[0])},
		{"cancel", ctl(7, &Cancel{})},
		{"shutdown", ctl(9, &ShutdownRequest{})},
	}
}

func TestGoldenFrames(t *testing.T) {
	for _, tc := range goldenFrames() {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			for _, f := range tc.frames {
				if f.Kind == KindHello {
					buf.WriteString(Magic)
				}
				assert.NilError(t, WriteFrame(&buf, f))
			}
			golden.AssertBytes(t, buf.Bytes(), tc.name+".bin")

			// Read the golden file back: the same frames, and every
			// control message decodes.
			raw := golden.Get(t, tc.name+".bin")
			r := bufio.NewReader(bytes.NewReader(raw))
			for i, want := range tc.frames {
				if want.Kind == KindHello {
					assert.NilError(t, SkipToMagic(r))
				}
				got, err := ReadFrame(r)
				assert.NilError(t, err, "frame %d", i)
				assert.Equal(t, got.Kind, want.Kind)
				assert.Equal(t, got.Stream, want.Stream)
				assert.Assert(t, bytes.Equal(got.Payload, want.Payload))
				switch got.Kind {
				case KindControl:
					_, err := DecodeMessage(got.Payload)
					assert.NilError(t, err)
				case KindHello:
					_, err := DecodeHello(got.Payload)
					assert.NilError(t, err)
				}
			}
			_, err := ReadFrame(r)
			assert.Equal(t, err, io.EOF)
		})
	}
}

func TestReadFrameErrors(t *testing.T) {
	tooBig := []byte{0x00, 0x10, 0x00, 0x01, byte(KindFile), 0, 0, 0, 1}
	short := []byte{0, 0, 0, 5, byte(KindFile), 0, 0, 0, 1, 'a', 'b'}
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"partial header", []byte{0, 0, 0}, io.ErrUnexpectedEOF},
		{"payload too large", tooBig, ErrFrameTooLarge},
		{"short payload", short, io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tc.in))
			assert.Assert(t, errors.Is(err, tc.want), "got %v", err)
		})
	}
	_, err := AppendFrame(nil, Frame{Kind: KindFile, Payload: make([]byte, MaxPayload+1)})
	assert.ErrorIs(t, err, ErrFrameTooLarge)
}

func TestSkipToMagic(t *testing.T) {
	tests := []struct {
		name string
		in   string
		rest string
		err  error
	}{
		{"at start", Magic + "x", "x", nil},
		{"after junk", "junk\x00\x01" + Magic + "y", "y", nil},
		{"after a partial magic", Magic[:4] + Magic + "z", "z", nil},
		{"repeated first byte", "\xa5\xa5" + Magic + "w", "w", nil},
		{"none", "no magic here", "", io.EOF},
		{"too much junk", strings.Repeat("j", MaxResyncBytes+len(Magic)+2) + Magic, "", ErrNoMagic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := bufio.NewReader(strings.NewReader(tc.in))
			err := SkipToMagic(r)
			if tc.err != nil {
				assert.ErrorIs(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			rest, _ := io.ReadAll(r)
			assert.Equal(t, string(rest), tc.rest)
		})
	}
}

func TestDecodeMessage(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Message
		wantErr string
	}{
		{"exec", `{"type":"exec","argv":["ls","-l"],"timeout_ms":10,"future_field":1}`,
			&ExecRequest{Argv: []string{"ls", "-l"}, TimeoutMS: 10}, ""},
		{"fs with defaults", `{"type":"fs","op":"grep","path":"/","pattern":"x"}`,
			&FSRequest{Op: OpGrep, Path: "/", Pattern: "x"}, ""},
		{"fs sed", `{"type":"fs","op":"sed","files":["/a"],"pattern":"a","replacement":"","regex":false}`,
			&FSRequest{Op: OpSed, Files: []string{"/a"}, Pattern: "a", Replacement: ptr(""), Regex: ptr(false)}, ""},
		{"error", `{"type":"error","code":"S211","message":"m","parent_missing":true}`,
			&Error{Code: "S211", Message: "m", ParentMissing: true}, ""},
		{"shutdown", `{"type":"shutdown"}`, &ShutdownRequest{}, ""},
		{"no type", `{"argv":["x"]}`, nil, `no "type"`},
		{"unknown type", `{"type":"frobnicate"}`, nil, "unknown message type"},
		{"not json", `{`, nil, "decode message"},
		{"exec empty argv", `{"type":"exec","argv":[]}`, nil, "argv is empty"},
		{"exec bad env", `{"type":"exec","argv":["x"],"env":["NOEQUALS"]}`, nil, "not K=V"},
		{"exec env empty key", `{"type":"exec","argv":["x"],"env":["=v"]}`, nil, "not K=V"},
		{"exec nul", `{"type":"exec","argv":["x\u0000"]}`, nil, "NUL"},
		{"exec negative timeout", `{"type":"exec","argv":["x"],"timeout_ms":-1}`, nil, "negative"},
		{"exec huge cap", `{"type":"exec","argv":["x"],"max_output_bytes":1e12}`, nil, "max_output_bytes"},
		{"exec wrong type", `{"type":"exec","argv":"ls"}`, nil, "decode exec"},
		{"fs no op", `{"type":"fs"}`, nil, "op is empty"},
		{"started zero pid", `{"type":"started","pid":0}`, nil, "pid"},
		{"error no code", `{"type":"error"}`, nil, "without a code"},
		// encoding/json takes the last of duplicate keys and matches keys
		// in any case: the one-pass decode must not read the first tag.
		{"a later type wins", `{"type":"exec","argv":["x"],"type":"shutdown"}`, &ShutdownRequest{}, ""},
		{"a later TYPE wins", `{"type":"exec","argv":["x"],"TyPe":"shutdown"}`, &ShutdownRequest{}, ""},
		{"an escaped type wins", `{"type":"exec","argv":["x"],"typ\u0065":"shutdown"}`, &ShutdownRequest{}, ""},
		{"type inside a value", `{"type":"exec","argv":["type","TYPE"]}`, &ExecRequest{Argv: []string{"type", "TYPE"}}, ""},
		{"non-ASCII", `{"type":"exec","argv":["é"]}`, &ExecRequest{Argv: []string{"é"}}, ""},
		{"tag not first", `{"argv":["x"],"type":"exec"}`, &ExecRequest{Argv: []string{"x"}}, ""},
		{"trailing garbage", `{"type":"exec","argv":["x"]}x`, nil, "decode message"},
		{"tag not plain", `{"type":"ex\u0065c","argv":["x"]}`, &ExecRequest{Argv: []string{"x"}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeMessage([]byte(tc.in))
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

// decodeTwoPass is DecodeMessage without its one-pass shortcut: the type
// tag read by a decode of its own, then the message.
func decodeTwoPass(p []byte) (Message, error) {
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

func TestEncodeMessageRoundTrip(t *testing.T) {
	msgs := []Message{
		&ExecRequest{Argv: []string{"a"}, Env: []string{"A=1"}},
		&FSRequest{Op: OpChmod, Path: "/x", Mode: "0600", Recursive: ptr(true), UID: ptr(0)},
		&NetRequest{},
		&ShutdownRequest{},
		&Cancel{},
		&Started{PID: 7},
		&ExitStatus{ExitCode: 1},
		&FileMeta{Size: 1, Mode: "0644", Mtime: 2},
		&Result{Op: OpLs, Body: json.RawMessage(`{"entries":[]}`)},
		&Error{Code: CodeFSIO, Message: "x"},
	}
	for _, m := range msgs {
		t.Run(m.MessageType(), func(t *testing.T) {
			p, err := EncodeMessage(m)
			assert.NilError(t, err)
			assert.Assert(t, strings.HasPrefix(string(p), `{"type":"`+m.MessageType()+`"`), string(p))
			got, err := DecodeMessage(p)
			assert.NilError(t, err)
			assert.DeepEqual(t, got, m)
		})
	}
}

func TestLargeControlMessageIsSplit(t *testing.T) {
	var matches []GrepMatch
	for i := range 3000 {
		matches = append(matches, GrepMatch{Path: "/f", Line: i, Content: strings.Repeat("x", 500)})
	}
	body, err := json.Marshal(GrepResult{Matches: matches})
	assert.NilError(t, err)
	frames, err := EncodeControl(11, &Result{Op: OpGrep, Body: body})
	assert.NilError(t, err)
	assert.Assert(t, len(frames) > 1)

	var a Assembler
	// Another stream's single-frame message interleaves with the parts.
	other, err := EncodeControl(13, &Cancel{})
	assert.NilError(t, err)
	var got []byte
	for i, f := range frames {
		assert.Assert(t, len(f.Payload) <= MaxPayload)
		if i == 1 {
			m, done, err := a.Add(other[0])
			assert.NilError(t, err)
			assert.Assert(t, done)
			_, err = DecodeMessage(m)
			assert.NilError(t, err)
		}
		m, done, err := a.Add(f)
		assert.NilError(t, err)
		assert.Equal(t, done, i == len(frames)-1)
		if done {
			got = m
		}
	}
	msg, err := DecodeMessage(got)
	assert.NilError(t, err)
	var res GrepResult
	assert.NilError(t, json.Unmarshal(msg.(*Result).Body, &res))
	assert.Check(t, is.Len(res.Matches, 3000))
	assert.Equal(t, a.total, 0)
}

func TestAssemblerBounds(t *testing.T) {
	var a Assembler
	part := Frame{Kind: KindControlPart, Stream: 1, Payload: make([]byte, MaxPayload)}
	var err error
	for range MaxMessage/MaxPayload + 1 {
		if _, _, err = a.Add(part); err != nil {
			break
		}
	}
	assert.ErrorIs(t, err, ErrMessageTooBig)
	assert.Equal(t, a.total, 0)
	_, _, err = a.Add(Frame{Kind: KindFile})
	assert.ErrorContains(t, err, "assembler")
}

func TestHelloCompatibility(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		decErr  string
		compErr string
	}{
		{"same", `{"role":"agent","protocol_major":1,"protocol_minor":0,"nonce":"x"}`, "", ""},
		{"newer minor", `{"role":"agent","protocol_major":1,"protocol_minor":7,"nonce":"x","capabilities":["exec","teleport"]}`, "", ""},
		{"newer major", `{"role":"agent","protocol_major":2,"protocol_minor":0}`, "", CodeProtocolMismatch},
		{"bad role", `{"role":"x","protocol_major":1}`, "unknown role", ""},
		{"zero major", `{"role":"agent","protocol_major":0}`, "invalid protocol version", ""},
		{"garbage", `[1]`, "decode hello", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := DecodeHello([]byte(tc.in))
			if tc.decErr != "" {
				assert.ErrorContains(t, err, tc.decErr)
				return
			}
			assert.NilError(t, err)
			err = CheckCompatible(h)
			if tc.compErr != "" {
				var e *Error
				assert.Assert(t, errors.As(err, &e))
				assert.Equal(t, e.Code, tc.compErr)
				return
			}
			assert.NilError(t, err)
		})
	}
}

func TestWindows(t *testing.T) {
	ctx := context.Background()
	w := NewSendWindow()
	n, err := w.Acquire(ctx, InitialWindow+10)
	assert.NilError(t, err)
	assert.Equal(t, n, InitialWindow)

	// Empty: Acquire waits for a grant.
	got := make(chan int)
	go func() {
		n, _ := w.Acquire(ctx, 100)
		got <- n
	}()
	w.Grant(40)
	assert.Equal(t, waitfor.Recv(t, got, waitfor.Default, "Acquire to return the grant"), 40)

	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err = w.Acquire(short, 1)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	w.Close(io.ErrClosedPipe)
	_, err = w.Acquire(ctx, 1)
	assert.ErrorIs(t, err, io.ErrClosedPipe)

	var r RecvWindow
	assert.NilError(t, r.Received(InitialWindow))
	assert.ErrorIs(t, r.Received(1), ErrWindowExceeded)
	r.Consumed(10)
	assert.NilError(t, r.Received(10))

	_, err = ParseWindow([]byte{0, 0, 0})
	assert.ErrorContains(t, err, "4")
	_, err = ParseWindow(WindowPayload(0))
	assert.ErrorContains(t, err, "out of range")
	v, err := ParseWindow(WindowPayload(5))
	assert.NilError(t, err)
	assert.Equal(t, v, uint32(5))
}

func FuzzReadFrame(f *testing.F) {
	for _, tc := range goldenFrames() {
		var buf bytes.Buffer
		for _, fr := range tc.frames {
			_ = WriteFrame(&buf, fr)
		}
		f.Add(buf.Bytes())
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		var a Assembler
		for {
			fr, err := ReadFrame(r)
			if err != nil {
				return
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("payload of %d bytes", len(fr.Payload))
			}
			// A frame read back re-encodes to the same bytes.
			b, err := AppendFrame(nil, fr)
			if err != nil {
				t.Fatal(err)
			}
			again, err := ReadFrame(bytes.NewReader(b))
			if err != nil || again.Kind != fr.Kind || again.Stream != fr.Stream || !bytes.Equal(again.Payload, fr.Payload) {
				t.Fatalf("re-encode mismatch: %v", err)
			}
			switch fr.Kind {
			case KindControl, KindControlPart:
				if m, done, err := a.Add(fr); err == nil && done {
					_, _ = DecodeMessage(m)
				}
			case KindHello:
				_, _ = DecodeHello(fr.Payload)
			case KindWindow:
				_, _ = ParseWindow(fr.Payload)
			}
		}
	})
}

func FuzzDecodeMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"exec","argv":["ls"]}`,
		`{"type":"fs","op":"sed","files":["/a"],"pattern":"a","replacement":"b"}`,
		`{"type":"error","code":"S211","message":"m","parent_missing":true}`,
		`{"type":"exit","exit_code":0,"duration_us":1}`,
		`{"type":"result","op":"ls","body":{"entries":[]}}`,
		`{"type":"meta","size":1,"mode":"0644","mtime":1}`,
		`{"type":"net","dns":["1.1.1.1"]}`,
		`{"type":"spawn","name":"worker","argv":["/bin/sh","-c","node ."],"env":["A=1"],"workdir":"/workspace"}`,
		`{"type":"proc_stop","name":"worker","grace_ms":10000}`,
		`{"type":"workspace","dir":"/workspace","prune":true,"keep":["node_modules"]}`,
		`{"type":"net_stats","interface":"eth0"}`,
		`{"type":"reseed","seed":"AAEC","unix_nano":1800000000000000000}`,
		`{"type":"net_stats","interface":"../x"}`,
		`{"type":"result","op":"net_stats","body":{"tcp_in_segs":3,"tcp_pure_acks":1,"interface":"eth0","if_rx_packets":4}}`,
		`{"role":"agent","protocol_major":1,"protocol_minor":0}`,
	} {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"type":"exec","argv":["x"],"TYPE":"shutdown"}`))
	f.Add([]byte(`{"type":"exec","argv":["x"],"typ\u0065":"fs","op":"ls"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMessage(data)
		// The one-pass shortcut decodes exactly what two passes do.
		m2, err2 := decodeTwoPass(data)
		if fmt.Sprint(err) != fmt.Sprint(err2) || !reflect.DeepEqual(m, m2) {
			t.Fatalf("one pass: %#v, %v; two passes: %#v, %v", m, err, m2, err2)
		}
		if err == nil {
			// Whatever decodes re-encodes and decodes to the same value.
			p, err := EncodeMessage(m)
			if err != nil {
				t.Fatal(err)
			}
			m2, err := DecodeMessage(p)
			if err != nil {
				t.Fatalf("re-decode: %v (%s)", err, p)
			}
			if m2.MessageType() != m.MessageType() {
				t.Fatalf("type changed: %s → %s", m.MessageType(), m2.MessageType())
			}
		}
		if h, err := DecodeHello(data); err == nil {
			_ = CheckCompatible(h)
		}
	})
}

func FuzzSkipToMagic(f *testing.F) {
	f.Add([]byte("junk" + Magic + "rest"))
	f.Add([]byte(Magic[:5] + Magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bytes.NewReader(data)
		r := bufio.NewReader(br)
		if err := SkipToMagic(r); err == nil {
			// Success means it stopped right after the first Magic.
			consumed := int(br.Size()) - br.Len() - r.Buffered()
			if bytes.Index(data, []byte(Magic)) != consumed-len(Magic) {
				t.Fatalf("stopped at %d, first magic at %d", consumed, bytes.Index(data, []byte(Magic)))
			}
		}
	})
}

func TestReadFrameBufferedLeavesMagic(t *testing.T) {
	var buf bytes.Buffer
	assert.NilError(t, WriteFrame(&buf, Frame{Kind: KindStdin, Stream: 1, Payload: []byte("x")}))
	buf.WriteString(Magic)
	assert.NilError(t, WriteFrame(&buf, Frame{Kind: KindHello, Payload: []byte(`{}`)}))
	br := bufio.NewReader(&buf)
	f, err := ReadFrameBuffered(br)
	assert.NilError(t, err)
	assert.Equal(t, string(f.Payload), "x")
	_, err = ReadFrameBuffered(br)
	assert.ErrorIs(t, err, ErrFrameTooLarge)
	assert.NilError(t, SkipToMagic(br))
	f, err = ReadFrameBuffered(br)
	assert.NilError(t, err)
	assert.Equal(t, f.Kind, KindHello)

	_, err = ReadFrameBuffered(bufio.NewReader(bytes.NewReader([]byte{0, 0})))
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, err = ReadFrameBuffered(bufio.NewReader(bytes.NewReader(nil)))
	assert.ErrorIs(t, err, io.EOF)
}

func TestReseedRequest(t *testing.T) {
	for _, tc := range []struct {
		in  string
		err string
	}{
		{`{"type":"reseed","seed":"AAEC"}`, ""},
		{`{"type":"reseed","seed":"AAEC","unix_nano":1800000000000000000}`, ""},
		{`{"type":"reseed"}`, "seed must hold 1 to 512 bytes, got 0"},
		{`{"type":"reseed","seed":"` + strings.Repeat("A", 4*171) + `"}`, "seed must hold 1 to 512 bytes, got 513"},
		{`{"type":"reseed","seed":"AAEC","unix_nano":-1}`, "before 1970"},
	} {
		m, err := DecodeMessage([]byte(tc.in))
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		assert.NilError(t, err, tc.in)
		_, ok := m.(*ReseedRequest)
		assert.Check(t, ok, tc.in)
	}
}

func TestNetStatsRequest(t *testing.T) {
	for _, tc := range []struct {
		in  string
		err string
	}{
		{`{"type":"net_stats"}`, ""},
		{`{"type":"net_stats","interface":"enp0s3"}`, ""},
		{`{"type":"net_stats","interface":"../../etc"}`, "is not an interface name"},
		{`{"type":"net_stats","interface":"a-name-longer-than-15"}`, "is not an interface name"},
		{`{"type":"net_stats","interface":"eth 0"}`, "is not an interface name"},
	} {
		m, err := DecodeMessage([]byte(tc.in))
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		assert.NilError(t, err, tc.in)
		_, ok := m.(*NetStatsRequest)
		assert.Check(t, ok, tc.in)
	}
}

// Payload counts data both ways and datagrams, not pure ACKs; a pure-ACK
// count above the segments (counters read a moment apart) is no payload.
func TestNetStatsPayload(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    NetStats
		want uint64
	}{
		{"nothing", NetStats{}, 0},
		{"acks only", NetStats{TCPInSegs: 10, TCPPureAcks: 6, TCPHPAcks: 4}, 0},
		{"data in", NetStats{TCPInSegs: 10, TCPPureAcks: 6, TCPHPAcks: 1}, 3},
		{"data out", NetStats{TCPOrigDataSent: 5}, 5},
		{"udp", NetStats{UDPInDatagrams: 2, UDPOutDatagrams: 3}, 5},
		{"udp over ipv6", NetStats{UDP6InDatagrams: 2, UDP6OutDatagrams: 1}, 3},
		{"more acks than segments", NetStats{TCPInSegs: 1, TCPPureAcks: 5, UDPOutDatagrams: 1}, 1},
		{"interface packets do not count", NetStats{IfRxPackets: 100, IfTxPackets: 100}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.n.Payload(), tc.want)
		})
	}
}

// stepReader hands out its bytes in the sizes listed, one per Read, and
// counts the Reads.
type stepReader struct {
	data  []byte
	steps []int
	reads int
}

func (r *stepReader) Read(p []byte) (int, error) {
	r.reads++
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := len(r.data)
	if len(r.steps) > 0 {
		n, r.steps = min(r.steps[0], n), r.steps[1:]
	}
	n = copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// TestFrameBuffered: it says yes exactly when reading the next frame makes
// no Read on the source.
func TestFrameBuffered(t *testing.T) {
	var wire bytes.Buffer
	assert.NilError(t, WriteFrame(&wire, Frame{Kind: KindControl, Stream: 1, Payload: []byte(`{"type":"cancel"}`)}))
	first := wire.Len()
	assert.NilError(t, WriteFrame(&wire, Frame{Kind: KindStdin, Stream: 1, Payload: bytes.Repeat([]byte("x"), 100)}))
	assert.NilError(t, WriteFrame(&wire, Frame{Kind: KindWindow, Stream: 1, Payload: WindowPayload(5)}))
	// The source yields the first frame and half the second, then the
	// rest.
	src := &stepReader{data: wire.Bytes(), steps: []int{first + HeaderSize + 50}}
	br := bufio.NewReader(src)
	assert.Assert(t, !FrameBuffered(br), "nothing is buffered yet")
	_, err := br.Peek(1)
	assert.NilError(t, err)
	assert.Equal(t, src.reads, 1)
	assert.Assert(t, FrameBuffered(br))
	_, err = ReadFrameBuffered(br)
	assert.NilError(t, err)
	assert.Equal(t, src.reads, 1)
	assert.Assert(t, !FrameBuffered(br), "only half of the second frame is buffered")
	_, err = ReadFrameBuffered(br)
	assert.NilError(t, err)
	assert.Equal(t, src.reads, 2)
	assert.Assert(t, FrameBuffered(br))
	_, err = ReadFrameBuffered(br)
	assert.NilError(t, err)
	assert.Equal(t, src.reads, 2)
	assert.Assert(t, !FrameBuffered(br))

	// A header announcing more than the buffer holds (Magic read as a
	// header looks like this) is not buffered.
	br = bufio.NewReader(strings.NewReader(Magic + "0123456789"))
	_, _ = br.Peek(1)
	assert.Assert(t, !FrameBuffered(br))
}
