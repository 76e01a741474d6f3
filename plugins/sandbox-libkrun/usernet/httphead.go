package usernet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// MaxHead bounds the HTTP request head an HTTP forward reads from the
// guest, and the response head it reads from the host.
const MaxHead = 16 << 10

// ErrBadHead is what every refusal of an HTTP head wraps.
var ErrBadHead = errors.New("bad HTTP head")

func badHead(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadHead, fmt.Sprintf(format, args...))
}

// readHead reads an HTTP head, up to and including the empty line that
// ends it, of at most MaxHead bytes. Lines end with CRLF.
func readHead(r *bufio.Reader) ([]byte, error) {
	var head []byte
	start := 0 // where the current line began
	for {
		chunk, err := r.ReadSlice('\n')
		if len(head)+len(chunk) > MaxHead {
			return nil, badHead("longer than %d bytes", MaxHead)
		}
		head = append(head, chunk...)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue // the same line goes on
		case err != nil:
			return nil, err
		}
		line := head[start:]
		if bytes.Equal(line, []byte("\r\n")) {
			if start == 0 {
				// RFC 9112 lets a server skip empty lines before
				// the request line; nothing here needs that.
				return nil, badHead("empty line before the start line")
			}
			return head, nil
		}
		start = len(head)
	}
}

// headLines splits a head that ends with an empty line into its lines,
// refusing bare CR or LF, NUL and other control characters.
func headLines(head []byte) ([][]byte, error) {
	if !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		return nil, badHead("does not end with an empty line")
	}
	lines := bytes.Split(head[:len(head)-4], []byte("\r\n"))
	for _, l := range lines {
		for _, c := range l {
			if c == '\r' || c == '\n' || c == 0 || c == 0x7f || (c < 0x20 && c != '\t') {
				return nil, badHead("control character %#02x", c)
			}
		}
	}
	return lines, nil
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
}

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTokenChar(c) {
			return false
		}
	}
	return true
}

// ValidBearerToken reports whether tok can be sent as a bearer credential:
// 1 to 4096 visible ASCII characters.
func ValidBearerToken(tok string) bool {
	if len(tok) == 0 || len(tok) > 4096 {
		return false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < 0x21 || tok[i] > 0x7e {
			return false
		}
	}
	return true
}

// RewriteRequestHead checks an HTTP/1.1 request head from a guest and
// returns it as the forward sends it to its loopback upstream: the Host
// header replaced by host (the upstream's address: a loopback listener
// answers only loopback Host names, and the guest named the gateway),
// and, when token is set, every Authorization header the guest sent
// removed and "Authorization: Bearer <token>" added. It refuses a request
// that has or announces a body (Transfer-Encoding, a Content-Length other
// than 0), a malformed start line or header line (obsolete line folding,
// space before the colon), and more than one Host header: anything two
// parsers could read differently. method is the request's method.
func RewriteRequestHead(head []byte, host, token string) (out []byte, method string, err error) {
	if len(head) > MaxHead {
		return nil, "", badHead("longer than %d bytes", MaxHead)
	}
	if token != "" && !ValidBearerToken(token) {
		return nil, "", errors.New("the bearer token is too long or not visible ASCII")
	}
	if !ValidBearerToken(host) {
		return nil, "", errors.New("the upstream host is empty or not visible ASCII")
	}
	lines, err := headLines(head)
	if err != nil {
		return nil, "", err
	}
	parts := bytes.Split(lines[0], []byte(" "))
	if len(parts) != 3 || !isToken(parts[0]) || len(parts[1]) == 0 || !bytes.Equal(parts[2], []byte("HTTP/1.1")) {
		return nil, "", badHead("the request line is not METHOD SP TARGET SP HTTP/1.1")
	}
	for _, c := range parts[1] {
		if c <= 0x20 || c >= 0x7f {
			return nil, "", badHead("the request target holds %#02x", c)
		}
	}
	var b bytes.Buffer
	b.Grow(len(head) + len(token) + 32)
	b.Write(lines[0])
	b.WriteString("\r\nHost: " + host + "\r\n")
	hosts := 0
	for _, l := range lines[1:] {
		name, value, ok := bytes.Cut(l, []byte(":"))
		if !ok || !isToken(name) {
			// Also refuses obsolete line folding (a line starting
			// with a space or tab) and a space before the colon.
			return nil, "", badHead("header line %q is not NAME: VALUE", truncate(string(l), 40))
		}
		value = bytes.Trim(value, " \t")
		switch {
		case bytes.EqualFold(name, []byte("Authorization")) && token != "":
			continue
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return nil, "", badHead("a request with Transfer-Encoding carries a body, which this forward does not relay")
		case bytes.EqualFold(name, []byte("Content-Length")):
			if !bytes.Equal(value, []byte("0")) {
				return nil, "", badHead("a request with Content-Length %q carries a body, which this forward does not relay", truncate(string(value), 20))
			}
		case bytes.EqualFold(name, []byte("Host")):
			if hosts++; hosts > 1 {
				return nil, "", badHead("more than one Host header")
			}
			continue
		}
		b.Write(name)
		b.WriteString(": ")
		b.Write(value)
		b.WriteString("\r\n")
	}
	if token != "" {
		b.WriteString("Authorization: Bearer " + token + "\r\n")
	}
	b.WriteString("\r\n")
	return b.Bytes(), string(parts[0]), nil
}

// statusCode reads the status code of an HTTP/1.x response head.
func statusCode(head []byte) (int, error) {
	line, _, _ := bytes.Cut(head, []byte("\r\n"))
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return 0, badHead("the status line %q is not HTTP/1.x CODE", truncate(string(line), 40))
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil || code < 100 || code > 999 {
		return 0, badHead("the status code %q is not three digits", line[9:12])
	}
	return code, nil
}
