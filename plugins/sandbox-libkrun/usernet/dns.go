package usernet

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Bounds of the DNS service.
const (
	// maxDNSMessage bounds a DNS message either way (the TCP length
	// prefix is 16 bits): an upstream's reply, an answer over TCP.
	maxDNSMessage = 65535
	// maxDNSQuery bounds a guest's query, over UDP or TCP: one question
	// (a name of at most 255 bytes) and an OPT record fit well under it,
	// and anything longer is answered FORMERR unread.
	maxDNSQuery = 512
	// dnsUDPReply is the most an answer over UDP holds without EDNS
	// (RFC 1035); a guest's EDNS payload size raises it up to
	// maxEDNSReply, the size that never fragments (DNS flag day 2020).
	dnsUDPReply  = 512
	maxEDNSReply = 1232
	// maxDNSRecords bounds the records an answer copies from an
	// upstream's reply.
	maxDNSRecords = 64
)

// dnsUpstreamTimeout bounds one query to one of the host's nameservers.
const dnsUpstreamTimeout = 3 * time.Second

// maxNameservers is how many of the host's nameservers are tried, as
// glibc's MAXNS.
const maxNameservers = 3

// HostNameservers reads the nameservers of a resolv.conf (the host's is
// /etc/resolv.conf). Without any, it returns the loopback resolver, as the
// C library does.
func HostNameservers(path string) ([]netip.AddrPort, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return defaultNameservers(), nil
		}
		return nil, err
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil {
			continue
		}
		if len(out) < maxNameservers {
			out = append(out, netip.AddrPortFrom(a.Unmap(), 53))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(out) == 0 {
		return defaultNameservers(), nil
	}
	return out, nil
}

func defaultNameservers() []netip.AddrPort {
	return []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53"), netip.MustParseAddrPort("[::1]:53")}
}

// dnsService answers queries to the guest's DNS address. It is the stack's
// own service, a resolver, not a relay: it parses each query strictly
// (parseDNSQuery), asks the host's nameservers (wherever they are, loopback
// included) a query of its own built from the parsed question alone, and
// builds the answer from the records it parsed out of theirs. No byte of a
// guest's message reaches a nameserver: not its header, its EDNS options,
// its extra sections, trailing bytes or a second message. It answers the
// special-use names localhost and invalid itself (RFC 6761), so they never
// leave the host.
//
// Go's net.Resolver is not used: it answers from the host's /etc/hosts
// (names the guest must not learn), applies the host's search domains, and
// returns addresses without their records (TTLs, CNAME chains).
type dnsService struct {
	upstreams []netip.AddrPort
	dial      func(ctx context.Context, network, address string) (net.Conn, error)
	// sem bounds the queries under way to the host's nameservers.
	sem     chan struct{}
	timeout time.Duration
}

// guestQuery is a guest's query that parseDNSQuery accepted.
type guestQuery struct {
	id       uint16
	rd       bool
	question dnsmessage.Question
	// edns says the query carried an OPT record; udpSize is the most an
	// answer over UDP may hold.
	edns    bool
	udpSize int
}

// dnsRefusal is why parseDNSQuery refused a message: the reply's rcode,
// and the question when it was read.
type dnsRefusal struct {
	id       uint16
	opcode   dnsmessage.OpCode
	rd       bool
	rcode    dnsmessage.RCode
	question *dnsmessage.Question
}

func (r *dnsRefusal) Error() string { return "DNS query refused: " + r.rcode.String() }

// errNotDNSQuery is a message that gets no reply at all: shorter than a
// header, or a response.
var errNotDNSQuery = errors.New("not a DNS query")

// DNS types a query may ask for and an answer may carry. A question for
// another data type gets an empty NOERROR answer without asking anyone; a
// question for a meta type (ANY, AXFR, IXFR, OPT, TSIG…) is REFUSED.
var dnsRecordTypes = map[dnsmessage.Type]bool{
	dnsmessage.TypeA: true, dnsmessage.TypeAAAA: true, dnsmessage.TypeCNAME: true,
	dnsmessage.TypeMX: true, dnsmessage.TypeTXT: true, dnsmessage.TypeSRV: true,
	dnsmessage.TypePTR: true, dnsmessage.TypeNS: true, dnsmessage.TypeSOA: true,
}

func dnsMetaType(t dnsmessage.Type) bool {
	return t == 0 || t == dnsmessage.TypeOPT || (t >= 128 && t <= 255)
}

// parseDNSQuery reads a guest's message of size bytes, of which b holds
// the first min(size, maxDNSQuery) or all. It accepts only a standard
// query (opcode QUERY, not a response, no TC, zero Z and rcode bits) of
// exactly one question of class IN whose name is plain labels of letters,
// digits, '-' and '_' (no compression), no answer or authority records, at
// most one additional record, an EDNS version 0 OPT of well-formed
// options, and nothing after them. A response or a message shorter than a
// header returns errNotDNSQuery; anything else that is not accepted a
// *dnsRefusal: another opcode REFUSED, another class or a meta type
// REFUSED, everything else FORMERR.
func parseDNSQuery(b []byte, size int) (guestQuery, error) {
	if len(b) < 12 || size < len(b) {
		return guestQuery{}, errNotDNSQuery
	}
	flags := binary.BigEndian.Uint16(b[2:])
	if flags&0x8000 != 0 {
		return guestQuery{}, errNotDNSQuery
	}
	ref := &dnsRefusal{id: binary.BigEndian.Uint16(b), opcode: dnsmessage.OpCode(flags >> 11 & 0xf), rd: flags&0x0100 != 0}
	formErr := func() (guestQuery, error) { ref.rcode = dnsmessage.RCodeFormatError; return guestQuery{}, ref }
	if ref.opcode != 0 {
		ref.rcode = dnsmessage.RCodeRefused
		return guestQuery{}, ref
	}
	// AA and TC mean nothing in a query but TC is a broken client; Z and
	// a query rcode must be zero. AD and CD are allowed (stubs set AD).
	if size > maxDNSQuery || len(b) != size || flags&0x0200 != 0 || flags&0x0040 != 0 || flags&0x000f != 0 {
		return formErr()
	}
	qd, an, ns, ar := binary.BigEndian.Uint16(b[4:]), binary.BigEndian.Uint16(b[6:]), binary.BigEndian.Uint16(b[8:]), binary.BigEndian.Uint16(b[10:])
	if qd != 1 || an != 0 || ns != 0 || ar > 1 {
		return formErr()
	}
	off := 12
	var name []byte
	for {
		if off >= len(b) {
			return formErr()
		}
		l := int(b[off])
		off++
		if l == 0 {
			break
		}
		// No compression pointers or extended labels: a query's one
		// name has nothing earlier to point at.
		if l > 63 || off+l > len(b) || len(name)+l+1 > 253 {
			return formErr()
		}
		for _, c := range b[off : off+l] {
			if !dnsLabelByte(c) {
				return formErr()
			}
		}
		name = append(append(name, b[off:off+l]...), '.')
		off += l
	}
	if len(name) == 0 {
		name = []byte(".")
	}
	if off+4 > len(b) {
		return formErr()
	}
	qn, err := dnsmessage.NewName(string(name))
	if err != nil {
		return formErr()
	}
	question := dnsmessage.Question{Name: qn, Type: dnsmessage.Type(binary.BigEndian.Uint16(b[off:])), Class: dnsmessage.Class(binary.BigEndian.Uint16(b[off+2:]))}
	off += 4
	q := guestQuery{id: ref.id, rd: ref.rd, question: question, udpSize: dnsUDPReply}
	if ar == 1 {
		// Only an OPT record: the root name, type OPT, the payload
		// size as its class, version 0, options that fill its data.
		if off+11 > len(b) || b[off] != 0 || dnsmessage.Type(binary.BigEndian.Uint16(b[off+1:])) != dnsmessage.TypeOPT {
			return formErr()
		}
		payload := int(binary.BigEndian.Uint16(b[off+3:]))
		version := b[off+6]
		rdlen := int(binary.BigEndian.Uint16(b[off+9:]))
		off += 11
		if version != 0 || off+rdlen > len(b) {
			return formErr()
		}
		opts := b[off : off+rdlen]
		for len(opts) > 0 {
			if len(opts) < 4 || 4+int(binary.BigEndian.Uint16(opts[2:])) > len(opts) {
				return formErr()
			}
			opts = opts[4+int(binary.BigEndian.Uint16(opts[2:])):]
		}
		off += rdlen
		q.edns = true
		q.udpSize = min(max(payload, dnsUDPReply), maxEDNSReply)
	}
	if off != len(b) {
		return formErr()
	}
	ref.question = &q.question
	switch {
	case question.Class != dnsmessage.ClassINET, dnsMetaType(question.Type):
		ref.rcode = dnsmessage.RCodeRefused
		return guestQuery{}, ref
	}
	return q, nil
}

// dnsLabelByte reports whether c may be in a label of a name a guest asks
// about: a host name's letters, digits and '-', and '_' (SRV and other
// service names).
func dnsLabelByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// answer returns the reply to the guest's message q of size bytes (q holds
// at most the first maxDNSQuery of them), or nil to send none (q is not a
// query). overTCP says how it came, which bounds the answer.
func (d *dnsService) answer(ctx context.Context, q []byte, size int, overTCP bool) []byte {
	query, err := parseDNSQuery(q, size)
	if err != nil {
		var ref *dnsRefusal
		if !errors.As(err, &ref) {
			return nil
		}
		return packDNS(dnsmessage.Header{ID: ref.id, Response: true, OpCode: ref.opcode, RecursionDesired: ref.rd,
			RecursionAvailable: true, RCode: ref.rcode}, ref.question, nil, nil, false)
	}
	limit := maxDNSMessage
	if !overTCP {
		limit = query.udpSize
	}
	question := query.question
	name := strings.ToLower(question.Name.String())
	h := dnsmessage.Header{ID: query.id, Response: true, RecursionDesired: query.rd, RecursionAvailable: true}
	respond := func(rcode dnsmessage.RCode, answers, authorities []dnsmessage.Resource) []byte {
		h.RCode = rcode
		return fitDNS(h, &question, answers, authorities, query.edns, limit)
	}
	switch {
	case name == "localhost." || strings.HasSuffix(name, ".localhost."):
		h.Authoritative = true
		return respond(dnsmessage.RCodeSuccess, localhostAnswer(question), nil)
	case name == "invalid." || strings.HasSuffix(name, ".invalid."):
		h.Authoritative = true
		return respond(dnsmessage.RCodeNameError, nil, nil)
	case !dnsRecordTypes[question.Type]:
		return respond(dnsmessage.RCodeSuccess, nil, nil)
	}
	select {
	case d.sem <- struct{}{}:
		defer func() { <-d.sem }()
	default:
		return respond(dnsmessage.RCodeServerFailure, nil, nil)
	}
	qname, err := dnsmessage.NewName(name)
	if err != nil {
		// name came out of a parsed Name, so this should not happen; a
		// guest's input never reaches a panic all the same.
		return respond(dnsmessage.RCodeFormatError, nil, nil)
	}
	ours := dnsmessage.Question{Name: qname, Type: question.Type, Class: dnsmessage.ClassINET}
	for _, up := range d.upstreams {
		if m := d.ask(ctx, up, ours); m != nil {
			switch m.RCode {
			case dnsmessage.RCodeSuccess, dnsmessage.RCodeNameError:
				answers, authorities := dnsRecords(m, ours.Name, question.Name)
				return respond(m.RCode, answers, authorities)
			}
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	return respond(dnsmessage.RCodeServerFailure, nil, nil)
}

// dnsRecords picks what an answer carries from an upstream's reply m to
// the question for ours: its answers of class IN and a known type, the
// owner name ours given the guest's spelling (asked), and the SOA of its
// authority section (the TTL of a negative answer); at most maxDNSRecords.
func dnsRecords(m *dnsmessage.Message, ours, asked dnsmessage.Name) (answers, authorities []dnsmessage.Resource) {
	for _, r := range m.Answers {
		if len(answers) == maxDNSRecords {
			break
		}
		if r.Header.Class != dnsmessage.ClassINET || !dnsRecordTypes[r.Header.Type] {
			continue
		}
		if strings.EqualFold(r.Header.Name.String(), ours.String()) {
			r.Header.Name = asked
		}
		answers = append(answers, r)
	}
	for _, r := range m.Authorities {
		if r.Header.Class == dnsmessage.ClassINET && r.Header.Type == dnsmessage.TypeSOA && len(answers)+len(authorities) < maxDNSRecords {
			authorities = append(authorities, r)
		}
	}
	return answers, authorities
}

// ask sends the question q, in a message of the stack's own, to one
// nameserver: over UDP, then TCP if the reply was truncated. It returns
// the reply, parsed and checked (a response to that message and that
// question), or nil on any failure.
func (d *dnsService) ask(ctx context.Context, up netip.AddrPort, q dnsmessage.Question) *dnsmessage.Message {
	var idb [2]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil
	}
	id := binary.BigEndian.Uint16(idb[:])
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(maxEDNSReply, dnsmessage.RCodeSuccess, false); err != nil {
		return nil
	}
	msg, err := (&dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: true}, Questions: []dnsmessage.Question{q},
		Additionals: []dnsmessage.Resource{{Header: opt, Body: &dnsmessage.OPTResource{}}}}).Pack()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	m := d.exchange(ctx, up, "udp", msg, id, q)
	if m != nil && m.Truncated {
		m = d.exchange(ctx, up, "tcp", msg, id, q)
	}
	return m
}

func (d *dnsService) exchange(ctx context.Context, up netip.AddrPort, network string, msg []byte, id uint16, q dnsmessage.Question) *dnsmessage.Message {
	c, err := d.dial(ctx, network, up.String())
	if err != nil {
		return nil
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if network == "tcp" {
		if err := writeDNSTCP(c, msg); err != nil {
			return nil
		}
		r, err := readDNSTCP(bufio.NewReader(c))
		if err != nil {
			return nil
		}
		return checkDNSReply(r, id, q)
	}
	if _, err := c.Write(msg); err != nil {
		return nil
	}
	buf := make([]byte, maxDNSMessage)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil
		}
		// A reply to another message (a late one, or a forgery) is
		// skipped.
		if m := checkDNSReply(buf[:n], id, q); m != nil {
			return m
		}
	}
}

// checkDNSReply parses r, and returns it if it is a response to the
// message id that asked q.
func checkDNSReply(r []byte, id uint16, q dnsmessage.Question) *dnsmessage.Message {
	var m dnsmessage.Message
	if err := m.Unpack(r); err != nil || !m.Response || m.ID != id || m.OpCode != 0 || len(m.Questions) != 1 {
		return nil
	}
	got := m.Questions[0]
	if got.Type != q.Type || got.Class != q.Class || !strings.EqualFold(got.Name.String(), q.Name.String()) {
		return nil
	}
	return &m
}

func localhostAnswer(q dnsmessage.Question) []dnsmessage.Resource {
	hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}
	switch q.Type {
	case dnsmessage.TypeA:
		hdr.Type = dnsmessage.TypeA
		return []dnsmessage.Resource{{Header: hdr, Body: &dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}}}}
	case dnsmessage.TypeAAAA:
		hdr.Type = dnsmessage.TypeAAAA
		return []dnsmessage.Resource{{Header: hdr, Body: &dnsmessage.AAAAResource{AAAA: netip.IPv6Loopback().As16()}}}
	}
	return nil
}

// fitDNS packs an answer into limit bytes: one that does not fit goes
// without its records and with TC set (the guest asks again over TCP);
// over TCP, where that cannot help, it is a SERVFAIL.
func fitDNS(h dnsmessage.Header, q *dnsmessage.Question, answers, authorities []dnsmessage.Resource, edns bool, limit int) []byte {
	b := packDNS(h, q, answers, authorities, edns)
	if b != nil && len(b) <= limit {
		return b
	}
	if limit < maxDNSMessage {
		h.Truncated = true
	} else {
		h.RCode = dnsmessage.RCodeServerFailure
	}
	return packDNS(h, q, nil, nil, edns)
}

// packDNS builds a reply; with edns it carries an OPT record of the
// stack's (RFC 6891: a query with one gets one).
func packDNS(h dnsmessage.Header, q *dnsmessage.Question, answers, authorities []dnsmessage.Resource, edns bool) []byte {
	msg := dnsmessage.Message{Header: h, Answers: answers, Authorities: authorities}
	if q != nil {
		msg.Questions = []dnsmessage.Question{*q}
	}
	if edns {
		var opt dnsmessage.ResourceHeader
		if err := opt.SetEDNS0(maxEDNSReply, h.RCode, false); err != nil {
			return nil
		}
		msg.Additionals = []dnsmessage.Resource{{Header: opt, Body: &dnsmessage.OPTResource{}}}
	}
	b, err := msg.Pack()
	if err != nil {
		return nil
	}
	return b
}

func writeDNSTCP(w io.Writer, m []byte) error {
	if len(m) > maxDNSMessage {
		return errors.New("DNS message too long")
	}
	b := make([]byte, 2+len(m))
	binary.BigEndian.PutUint16(b, uint16(len(m)))
	copy(b[2:], m)
	_, err := w.Write(b)
	return err
}

func readDNSTCP(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	m := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, m); err != nil {
		return nil, err
	}
	return m, nil
}

// readDNSQueryTCP reads one length-prefixed message of a guest's TCP
// stream and returns it with its size. Of a message longer than
// maxDNSQuery only the first maxDNSQuery bytes are kept (its header is
// what the FORMERR needs); the rest is read and dropped, never held.
func readDNSQueryTCP(r io.Reader) ([]byte, int, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, 0, err
	}
	size := int(binary.BigEndian.Uint16(l[:]))
	m := make([]byte, min(size, maxDNSQuery))
	if _, err := io.ReadFull(r, m); err != nil {
		return nil, 0, err
	}
	if _, err := io.CopyN(io.Discard, r, int64(size-len(m))); err != nil {
		return nil, 0, err
	}
	return m, size, nil
}
