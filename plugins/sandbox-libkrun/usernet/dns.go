package usernet

import (
	"bufio"
	"context"
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

// maxDNSMessage bounds a DNS message either way (the TCP length prefix is
// 16 bits).
const maxDNSMessage = 65535

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
// own service: it asks the host's nameservers (wherever they are, loopback
// included) on the guest's behalf, and answers the special-use names
// localhost and invalid itself (RFC 6761), so they never leave the host.
type dnsService struct {
	upstreams []netip.AddrPort
	dial      func(ctx context.Context, network, address string) (net.Conn, error)
	// sem bounds the queries under way to the host's nameservers.
	sem     chan struct{}
	timeout time.Duration
}

// answer returns the reply to the query q, or nil to send none (q is not a
// query). overTCP says how q came, and how to ask upstream.
func (d *dnsService) answer(ctx context.Context, q []byte, overTCP bool) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil
	}
	question, err := p.Question()
	if err != nil {
		return reply(h, nil, dnsmessage.RCodeFormatError, nil)
	}
	name := strings.ToLower(question.Name.String())
	switch {
	case name == "localhost." || strings.HasSuffix(name, ".localhost."):
		return reply(h, &question, dnsmessage.RCodeSuccess, localhostAnswer(question))
	case name == "invalid." || strings.HasSuffix(name, ".invalid."):
		return reply(h, &question, dnsmessage.RCodeNameError, nil)
	}
	select {
	case d.sem <- struct{}{}:
		defer func() { <-d.sem }()
	default:
		return reply(h, &question, dnsmessage.RCodeServerFailure, nil)
	}
	for _, up := range d.upstreams {
		if r := d.ask(ctx, up, q, h.ID, overTCP); r != nil {
			return r
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	return reply(h, &question, dnsmessage.RCodeServerFailure, nil)
}

// ask sends q to one nameserver and returns its reply, nil on any failure.
func (d *dnsService) ask(ctx context.Context, up netip.AddrPort, q []byte, id uint16, overTCP bool) []byte {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	network := "udp"
	if overTCP {
		network = "tcp"
	}
	c, err := d.dial(ctx, network, up.String())
	if err != nil {
		return nil
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	var r []byte
	if overTCP {
		if err := writeDNSTCP(c, q); err != nil {
			return nil
		}
		if r, err = readDNSTCP(bufio.NewReader(c)); err != nil {
			return nil
		}
	} else {
		if _, err := c.Write(q); err != nil {
			return nil
		}
		buf := make([]byte, maxDNSMessage)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return nil
			}
			// A reply to another query (a late one, or a forgery)
			// is skipped.
			if n >= 12 && binary.BigEndian.Uint16(buf) == id && buf[2]&0x80 != 0 {
				r = buf[:n]
				break
			}
		}
	}
	var p dnsmessage.Parser
	if rh, err := p.Start(r); err != nil || !rh.Response || rh.ID != id {
		return nil
	}
	return r
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

// reply builds a response to the query with header h.
func reply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, answers []dnsmessage.Resource) []byte {
	msg := dnsmessage.Message{
		Header: dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, Authoritative: rcode != dnsmessage.RCodeServerFailure,
			RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode},
		Answers: answers,
	}
	if q != nil {
		msg.Questions = []dnsmessage.Question{*q}
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
