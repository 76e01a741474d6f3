package usernet

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// rawResolver is a loopback nameserver that records every byte it is
// sent, over UDP and TCP on one port, whether or not it parses, and
// answers each A query it can parse with 192.0.2.77 (TTL 5), an AAAA one
// with a CNAME then 2001:db8::77.
type rawResolver struct {
	addr netip.AddrPort
	mu   sync.Mutex
	got  [][]byte // every datagram, every TCP connection's bytes
}

func startRawResolver(t *testing.T) *rawResolver {
	t.Helper()
	var (
		pc  net.PacketConn
		ln  net.Listener
		err error
	)
	for range 20 {
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
		assert.NilError(t, err)
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		_ = pc.Close()
	}
	assert.NilError(t, err)
	r := &rawResolver{addr: netip.MustParseAddrPort(pc.LocalAddr().String())}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			r.record(buf[:n])
			if a := rawAnswer(buf[:n]); a != nil {
				_, _ = pc.WriteTo(a, from)
			}
		}
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			var all bytes.Buffer
			q, err := readDNSTCP(io.TeeReader(c, &all))
			r.record(all.Bytes())
			if err == nil {
				if a := rawAnswer(q); a != nil {
					_ = writeDNSTCP(c, a)
				}
			}
			_ = c.Close()
		}
	})
	t.Cleanup(func() {
		_ = pc.Close()
		_ = ln.Close()
		waitfor.Group(t, &wg, waitfor.Default, "the test resolver's servers to end")
	})
	return r
}

func (r *rawResolver) record(b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, bytes.Clone(b))
}

func (r *rawResolver) received() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.got...)
}

func rawAnswer(q []byte) []byte {
	var m dnsmessage.Message
	if m.Unpack(q) != nil || len(m.Questions) != 1 {
		return nil
	}
	qn := m.Questions[0].Name
	m.Header.Response = true
	m.Additionals = nil
	switch m.Questions[0].Type {
	case dnsmessage.TypeA:
		m.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: qn, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
			Body: &dnsmessage.AResource{A: [4]byte{192, 0, 2, 77}}}}
	case dnsmessage.TypeAAAA:
		target := dnsmessage.MustNewName("target.example.test.")
		m.Answers = []dnsmessage.Resource{
			{Header: dnsmessage.ResourceHeader{Name: qn, Type: dnsmessage.TypeCNAME, Class: dnsmessage.ClassINET, TTL: 5},
				Body: &dnsmessage.CNAMEResource{CNAME: target}},
			{Header: dnsmessage.ResourceHeader{Name: target, Type: dnsmessage.TypeAAAA, Class: dnsmessage.ClassINET, TTL: 5},
				Body: &dnsmessage.AAAAResource{AAAA: netip.MustParseAddr("2001:db8::77").As16()}},
		}
	}
	b, _ := m.Pack()
	return b
}

// rawQuery is a DNS message written byte by byte, as a hostile guest
// would: a header, then whatever follows.
func rawQuery(id, flags, qd, an, ns, ar uint16, rest ...[]byte) []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint16(b[0:], id)
	binary.BigEndian.PutUint16(b[2:], flags)
	binary.BigEndian.PutUint16(b[4:], qd)
	binary.BigEndian.PutUint16(b[6:], an)
	binary.BigEndian.PutUint16(b[8:], ns)
	binary.BigEndian.PutUint16(b[10:], ar)
	for _, r := range rest {
		b = append(b, r...)
	}
	return b
}

// qsec is a question section: name's labels, type, class.
func qsec(name string, typ, class uint16) []byte {
	var b []byte
	for l := range bytes.SplitSeq([]byte(name), []byte(".")) {
		if len(l) > 0 {
			b = append(append(b, byte(len(l))), l...)
		}
	}
	b = append(b, 0)
	return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(b, typ), class)
}

// opt is an OPT record: payload size, version, and options' bytes.
func opt(payload uint16, version byte, options []byte) []byte {
	b := []byte{0, 0, 41}
	b = binary.BigEndian.AppendUint16(b, payload)
	b = append(b, 0, version, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(len(options)))
	return append(b, options...)
}

// marker is what a hostile guest hides in its messages; it must never
// reach a nameserver.
var marker = []byte("GUESTBYTES-0xdeadbeef")

const (
	rd        = 0x0100
	opUpdate  = 5 << 11
	typeA     = 1
	typeAAAA  = 28
	typeHTTPS = 65
	typeANY   = 255
	typeAXFR  = 252
	classIN   = 1
	classCH   = 3
)

// TestDNSRefusesWhatIsNotAQuery sends what a hostile guest would through
// the guest's stack to the DNS address, over UDP and TCP: each gets its
// FORMERR or REFUSED (or no reply, for a response), and the nameserver
// receives nothing but the stack's own queries for the two well-formed
// lookups, with none of the guest's bytes.
func TestDNSRefusesWhatIsNotAQuery(t *testing.T) {
	up := startRawResolver(t)
	g := startGuest(t, Config{DNSServers: []netip.AddrPort{up.addr}}, nil)
	formErr, refused := dnsmessage.RCodeFormatError, dnsmessage.RCodeRefused
	bigOption := append(binary.BigEndian.AppendUint16([]byte{0xfd, 0xe9}, 600), bytes.Repeat(marker, 30)[:600]...)
	cases := []struct {
		name string
		msg  []byte
		want dnsmessage.RCode
	}{
		{"update opcode with trailing bytes", rawQuery(1, opUpdate, 1, 0, 1, 0, qsec("example.test", 6, classIN), marker), refused},
		{"notify opcode", rawQuery(2, 4<<11, 1, 0, 0, 0, qsec("example.test", 6, classIN)), refused},
		{"two questions", rawQuery(3, rd, 2, 0, 0, 0, qsec("a.example.test", typeA, classIN), qsec("b.example.test", typeA, classIN)), formErr},
		{"no question", rawQuery(4, rd, 0, 0, 0, 0), formErr},
		{"trailing bytes", rawQuery(5, rd, 1, 0, 0, 0, qsec("example.test", typeA, classIN), marker), formErr},
		{"answer section in a query", rawQuery(6, rd, 1, 1, 0, 0, qsec("example.test", typeA, classIN), marker), formErr},
		{"truncated question", rawQuery(7, rd, 1, 0, 0, 0, qsec("example.test", typeA, classIN)[:9]), formErr},
		{"compression pointer", rawQuery(8, rd, 1, 0, 0, 0, []byte{0xc0, 0x00, 0, 1, 0, 1}), formErr},
		{"label bytes", rawQuery(9, rd, 1, 0, 0, 0, []byte{4, 'a', 0, '.', 0xff, 0, 0, 1, 0, 1}), formErr},
		{"class CHAOS", rawQuery(10, rd, 1, 0, 0, 0, qsec("version.bind", 16, classCH)), refused},
		{"type ANY", rawQuery(11, rd, 1, 0, 0, 0, qsec("example.test", typeANY, classIN)), refused},
		{"type AXFR", rawQuery(12, rd, 1, 0, 0, 0, qsec("example.test", typeAXFR, classIN)), refused},
		{"EDNS version 1", rawQuery(13, rd, 1, 0, 0, 1, qsec("example.test", typeA, classIN), opt(1232, 1, nil)), formErr},
		{"a TSIG, not an OPT", rawQuery(14, rd, 1, 0, 0, 1, qsec("example.test", typeA, classIN), []byte{0, 0, 250, 0, 255, 0, 0, 0, 0, 0, 0}), formErr},
		{"EDNS option overruns", rawQuery(15, rd, 1, 0, 0, 1, qsec("example.test", typeA, classIN), opt(1232, 0, []byte{0, 10, 0, 9, 1})), formErr},
		{"over 512 bytes", rawQuery(16, rd, 1, 0, 0, 1, qsec("example.test", typeA, classIN), opt(4096, 0, bigOption)), formErr},
		{"TC set", rawQuery(17, rd|0x0200, 1, 0, 0, 0, qsec("example.test", typeA, classIN)), formErr},
		{"Z set", rawQuery(18, rd|0x0040, 1, 0, 0, 0, qsec("example.test", typeA, classIN)), formErr},
	}
	c := g.dialUDP(t, "10.0.2.3:53")
	buf := make([]byte, 4096)
	exchange := func(q []byte) dnsmessage.Message {
		t.Helper()
		_, err := c.Write(q)
		assert.NilError(t, err)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, err := c.Read(buf)
		assert.NilError(t, err)
		return parseDNS(t, buf[:n])
	}
	for _, tc := range cases {
		t.Run("udp "+tc.name, func(t *testing.T) {
			m := exchange(tc.msg)
			assert.Check(t, m.Response)
			assert.Check(t, is.Equal(m.ID, binary.BigEndian.Uint16(tc.msg)))
			assert.Check(t, is.Equal(m.RCode, tc.want))
			assert.Check(t, is.Len(m.Answers, 0))
		})
	}
	// A response gets no reply: the next reply on the flow is the next
	// query's.
	_, err := c.Write(rawQuery(0x7777, 0x8000, 1, 1, 0, 0, qsec("example.test", typeA, classIN), marker))
	assert.NilError(t, err)
	m := exchange(rawQuery(0x4242, rd, 1, 0, 0, 0, qsec("nothing.invalid", typeA, classIN)))
	assert.Check(t, is.Equal(m.ID, uint16(0x4242)))
	// A type nobody needs answered gets an empty NOERROR, unasked.
	m = exchange(rawQuery(0x4343, rd, 1, 0, 0, 0, qsec("example.test", typeHTTPS, classIN)))
	assert.Check(t, is.Equal(m.RCode, dnsmessage.RCodeSuccess))
	assert.Check(t, is.Len(m.Answers, 0))

	tc, err := g.dialTCP(t, "10.0.2.3:53")
	assert.NilError(t, err)
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(60 * time.Second))
	tcpExchange := func(q []byte) dnsmessage.Message {
		t.Helper()
		assert.NilError(t, writeDNSTCP(tc, q))
		r, err := readDNSTCP(tc)
		assert.NilError(t, err)
		return parseDNS(t, r)
	}
	// 60 KB over TCP, as a QUERY and as an UPDATE: refused unread, and
	// the connection goes on.
	huge := rawQuery(20, rd, 1, 0, 0, 0, qsec("example.test", typeA, classIN), bytes.Repeat(marker, 60000/len(marker)))
	m = tcpExchange(huge)
	assert.Check(t, is.Equal(m.ID, uint16(20)))
	assert.Check(t, is.Equal(m.RCode, formErr))
	huge = rawQuery(21, opUpdate, 1, 0, 1, 0, qsec("example.test", 6, classIN), bytes.Repeat(marker, 60000/len(marker)))
	m = tcpExchange(huge)
	assert.Check(t, is.Equal(m.ID, uint16(21)))
	assert.Check(t, is.Equal(m.RCode, refused))
	m = tcpExchange(rawQuery(22, rd, 2, 0, 0, 0, qsec("a.example.test", typeA, classIN), qsec("b.example.test", typeA, classIN)))
	assert.Check(t, is.Equal(m.RCode, formErr))
	assert.Check(t, is.Len(up.received(), 0), "the nameserver received a refused message")

	// Well-formed lookups resolve, over UDP (with EDNS) and TCP; the
	// answer spells the name as the guest did (0x20 case randomisation).
	m = exchange(rawQuery(30, rd, 1, 0, 0, 1, qsec("ExAmPle.test", typeA, classIN), opt(1232, 0, []byte{0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8})))
	assert.Check(t, is.Equal(m.RCode, dnsmessage.RCodeSuccess))
	assert.Assert(t, is.Len(m.Answers, 1))
	assert.Check(t, is.Equal(m.Answers[0].Header.Name.String(), "ExAmPle.test."))
	assert.Check(t, is.Equal(m.Answers[0].Body.(*dnsmessage.AResource).A, [4]byte{192, 0, 2, 77}))
	assert.Check(t, is.Len(m.Additionals, 1), "an EDNS query gets an OPT back")
	m = tcpExchange(rawQuery(31, rd, 1, 0, 0, 0, qsec("example.test", typeAAAA, classIN)))
	assert.Check(t, is.Equal(m.RCode, dnsmessage.RCodeSuccess))
	assert.Assert(t, is.Len(m.Answers, 2))
	assert.Check(t, is.Equal(m.Answers[0].Body.(*dnsmessage.CNAMEResource).CNAME.String(), "target.example.test."))
	assert.Check(t, is.Equal(m.Answers[1].Body.(*dnsmessage.AAAAResource).AAAA, netip.MustParseAddr("2001:db8::77").As16()))

	got := up.received()
	assert.Assert(t, is.Len(got, 2), "one query of the stack's own per lookup")
	for i, b := range got {
		assert.Check(t, !bytes.Contains(b, marker), "message %d carries the guest's bytes", i)
		var um dnsmessage.Message
		assert.NilError(t, um.Unpack(stripTCPPrefix(b)))
		assert.Check(t, is.Len(um.Questions, 1))
		assert.Check(t, is.Equal(um.Questions[0].Name.String(), "example.test."))
		for _, a := range um.Additionals {
			o, ok := a.Body.(*dnsmessage.OPTResource)
			assert.Check(t, ok && len(o.Options) == 0, "no option of the guest's is passed on")
		}
	}
}

// stripTCPPrefix drops the length prefix of a message the resolver read
// over TCP (a UDP one has no prefix; both parse after this).
func stripTCPPrefix(b []byte) []byte {
	if len(b) >= 2 && int(binary.BigEndian.Uint16(b)) == len(b)-2 {
		return b[2:]
	}
	return b
}

// TestDNSAnswerFitsUDP: an answer larger than the guest's UDP size is
// sent truncated (TC, no records), so the guest asks again over TCP.
func TestDNSAnswerFitsUDP(t *testing.T) {
	var records []dnsmessage.Resource
	qn := dnsmessage.MustNewName("big.example.test.")
	for i := range 60 {
		records = append(records, dnsmessage.Resource{Header: dnsmessage.ResourceHeader{Name: qn, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
			Body: &dnsmessage.AResource{A: [4]byte{192, 0, 2, byte(i)}}})
	}
	q := dnsmessage.Question{Name: qn, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}
	h := dnsmessage.Header{ID: 9, Response: true}
	b := fitDNS(h, &q, records, nil, false, dnsUDPReply)
	assert.Assert(t, len(b) <= dnsUDPReply)
	var m dnsmessage.Message
	assert.NilError(t, m.Unpack(b))
	assert.Check(t, m.Truncated)
	assert.Check(t, is.Len(m.Answers, 0))
	b = fitDNS(h, &q, records, nil, false, maxDNSMessage)
	assert.NilError(t, m.Unpack(b))
	assert.Check(t, !m.Truncated)
	assert.Check(t, is.Len(m.Answers, 60))
}

// FuzzDNSQuery: any message a guest sends is answered (a reply that
// parses, with the guest's id) or dropped; nothing panics; an accepted
// query is at most maxDNSQuery bytes; and a nameserver is asked only for
// an accepted query of a type that is resolved, with a message of the
// stack's own that holds none of the guest's bytes beyond the name.
func FuzzDNSQuery(f *testing.F) {
	f.Add(rawQuery(1, rd, 1, 0, 0, 0, qsec("example.test", typeA, classIN)))
	f.Add(rawQuery(2, rd, 1, 0, 0, 1, qsec("example.test", typeAAAA, classIN), opt(4096, 0, []byte{0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8})))
	f.Add(rawQuery(3, opUpdate, 1, 0, 1, 0, qsec("example.test", 6, classIN), marker))
	f.Add(rawQuery(4, rd, 2, 0, 0, 0, qsec("a.test", typeA, classIN), qsec("b.test", typeA, classIN)))
	f.Add(rawQuery(5, rd, 1, 0, 0, 0, []byte{0xc0, 0x0c, 0, 1, 0, 1}))
	f.Add(rawQuery(6, rd, 1, 0, 0, 0, qsec("localhost", typeA, classIN)))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, msg []byte) {
		var asked [][]byte
		d := &dnsService{
			upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")},
			sem:       make(chan struct{}, 1),
			timeout:   time.Second,
			dial: func(ctx context.Context, network, address string) (net.Conn, error) {
				return &captureConn{sent: &asked}, nil
			},
		}
		size := len(msg)
		head := msg[:min(len(msg), maxDNSQuery)]
		q, perr := parseDNSQuery(head, size)
		if perr == nil && size > maxDNSQuery {
			t.Fatalf("accepted a query of %d bytes", size)
		}
		for _, overTCP := range []bool{false, true} {
			asked = nil
			r := d.answer(context.Background(), head, size, overTCP)
			if r == nil {
				if !errors.Is(perr, errNotDNSQuery) {
					t.Fatalf("no reply to a message parseDNSQuery did not drop: %v", perr)
				}
				continue
			}
			var m dnsmessage.Message
			if err := m.Unpack(r); err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			if !m.Response || m.ID != binary.BigEndian.Uint16(msg) {
				t.Fatalf("reply header %+v", m.Header)
			}
			if !overTCP && len(r) > maxEDNSReply {
				t.Fatalf("UDP reply of %d bytes", len(r))
			}
			if len(asked) > 0 && (perr != nil || !dnsRecordTypes[q.question.Type]) {
				t.Fatalf("asked a nameserver about a refused message")
			}
			for _, b := range asked {
				var um dnsmessage.Message
				if err := um.Unpack(stripTCPPrefix(b)); err != nil || len(um.Questions) != 1 || len(um.Answers)+len(um.Authorities) != 0 || len(um.Additionals) != 1 {
					t.Fatalf("the stack's query is not its own: %v %+v", err, um)
				}
			}
		}
	})
}

// captureConn records what is written to it and answers nothing: a
// nameserver that never replies, without a socket.
type captureConn struct {
	net.Conn
	sent *[][]byte
}

func (c *captureConn) Write(b []byte) (int, error) {
	*c.sent = append(*c.sent, bytes.Clone(b))
	return len(b), nil
}
func (c *captureConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (c *captureConn) Close() error                     { return nil }
func (c *captureConn) SetDeadline(time.Time) error      { return nil }
func (c *captureConn) SetReadDeadline(time.Time) error  { return nil }
func (c *captureConn) SetWriteDeadline(time.Time) error { return nil }
