package usernet

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestRewriteRequestHead(t *testing.T) {
	for _, tc := range []struct {
		name, in, want, err string
	}{
		{name: "the upstream's Host, the token",
			in:   "GET /ws HTTP/1.1\r\nHost: 10.0.2.2:49134\r\nUpgrade: websocket\r\n\r\n",
			want: "GET /ws HTTP/1.1\r\nHost: 127.0.0.1:49134\r\nUpgrade: websocket\r\nAuthorization: Bearer T0k\r\n\r\n"},
		{name: "drops the guest's Authorization, any case",
			in:   "GET / HTTP/1.1\r\nAuthorization: Bearer forged\r\nhost: h\r\nAUTHORIZATION:Basic x\r\nauthorization: \r\n\r\n",
			want: "GET / HTTP/1.1\r\nHost: 127.0.0.1:49134\r\nAuthorization: Bearer T0k\r\n\r\n"},
		{name: "no Host from the guest",
			in:   "GET / HTTP/1.1\r\nX: y\r\n\r\n",
			want: "GET / HTTP/1.1\r\nHost: 127.0.0.1:49134\r\nX: y\r\nAuthorization: Bearer T0k\r\n\r\n"},
		{name: "content-length 0 is no body",
			in:   "GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
			want: "GET / HTTP/1.1\r\nHost: 127.0.0.1:49134\r\nContent-Length: 0\r\nAuthorization: Bearer T0k\r\n\r\n"},
		{name: "trims optional whitespace",
			in:   "GET / HTTP/1.1\r\nX-A: \t v \t\r\n\r\n",
			want: "GET / HTTP/1.1\r\nHost: 127.0.0.1:49134\r\nX-A: v\r\nAuthorization: Bearer T0k\r\n\r\n"},
		{name: "transfer-encoding", in: "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", err: "Transfer-Encoding"},
		{name: "body", in: "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", err: "Content-Length"},
		{name: "two lengths", in: "POST / HTTP/1.1\r\nContent-Length: 0, 0\r\n\r\n", err: "Content-Length"},
		{name: "http/1.0", in: "GET / HTTP/1.0\r\n\r\n", err: "request line"},
		{name: "http/2 preface", in: "PRI * HTTP/2.0\r\n\r\n", err: "request line"},
		{name: "extra space", in: "GET  / HTTP/1.1\r\n\r\n", err: "request line"},
		{name: "bad method", in: "G@T / HTTP/1.1\r\n\r\n", err: "request line"},
		{name: "target control char", in: "GET /\x01 HTTP/1.1\r\n\r\n", err: "control"},
		{name: "obs-fold", in: "GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n", err: "NAME: VALUE"},
		{name: "space before colon", in: "GET / HTTP/1.1\r\nAuthorization : x\r\n\r\n", err: "NAME: VALUE"},
		{name: "no colon", in: "GET / HTTP/1.1\r\nHost\r\n\r\n", err: "NAME: VALUE"},
		{name: "bare LF", in: "GET / HTTP/1.1\r\nX: a\nAuthorization: x\r\n\r\n", err: "control"},
		{name: "bare CR", in: "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", err: "control"},
		{name: "NUL", in: "GET / HTTP/1.1\r\nX: a\x00\r\n\r\n", err: "control"},
		{name: "two hosts", in: "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", err: "Host"},
		{name: "unterminated", in: "GET / HTTP/1.1\r\nHost: a\r\n", err: "empty line"},
		{name: "too long", in: "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxHead) + "\r\n\r\n", err: "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := RewriteRequestHead([]byte(tc.in), "127.0.0.1:49134", "T0k")
			if tc.err != "" {
				assert.Assert(t, errors.Is(err, ErrBadHead), "%v", err)
				assert.Check(t, is.ErrorContains(err, tc.err))
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, string(out), tc.want)
		})
	}
	_, _, err := RewriteRequestHead([]byte("GET / HTTP/1.1\r\n\r\n"), "127.0.0.1:1", "a b")
	assert.ErrorContains(t, err, "bearer token")
	_, _, err = RewriteRequestHead([]byte("GET / HTTP/1.1\r\n\r\n"), "", "t")
	assert.ErrorContains(t, err, "upstream host")
	_, method, err := RewriteRequestHead([]byte("HEAD / HTTP/1.1\r\n\r\n"), "127.0.0.1:1", "x")
	assert.NilError(t, err)
	assert.Equal(t, method, "HEAD")
	// Without a token the guest's own Authorization passes; Host is
	// still the upstream's.
	out, _, err := RewriteRequestHead([]byte("GET / HTTP/1.1\r\nHost: 10.0.2.2:1\r\nAuthorization: Bearer mine\r\n\r\n"), "127.0.0.1:1", "")
	assert.NilError(t, err)
	assert.Equal(t, string(out), "GET / HTTP/1.1\r\nHost: 127.0.0.1:1\r\nAuthorization: Bearer mine\r\n\r\n")
}

func TestReadHead(t *testing.T) {
	long := "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 8000) + "\r\n\r\n"
	for _, tc := range []struct{ name, in, want, err string }{
		{"simple", "GET / HTTP/1.1\r\nHost: a\r\n\r\nrest", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", ""},
		// A long line ending right after a buffer boundary must not
		// read as the empty line.
		{"long line", long + "rest", long, ""},
		{"leading empty line", "\r\nGET / HTTP/1.1\r\n\r\n", "", "empty line before"},
		{"too long", "GET / HTTP/1.1\r\n" + strings.Repeat("X: a\r\n", MaxHead/6+1) + "\r\n", "", "longer than"},
		{"eof", "GET / HTTP/1.1\r\n", "", "EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, size := range []int{16, 4096} {
				got, err := readHead(bufio.NewReaderSize(strings.NewReader(tc.in), size))
				if tc.err != "" {
					assert.ErrorContains(t, err, tc.err)
					continue
				}
				assert.NilError(t, err)
				assert.Equal(t, string(got), tc.want)
			}
		})
	}
}

func TestStatusCode(t *testing.T) {
	for in, want := range map[string]int{
		"HTTP/1.1 101 Switching Protocols\r\n\r\n": 101,
		"HTTP/1.0 404\r\n\r\n":                     404,
		"HTTP/1.1 200 OK\r\n":                      200,
	} {
		got, err := statusCode([]byte(in))
		assert.NilError(t, err, in)
		assert.Equal(t, got, want)
	}
	for _, in := range []string{"", "HTTP/1.1 10\r\n", "HTTP/2 200 OK\r\n", "HTTP/1.1 2000 x\r\n", "HTTP/1.1 abc x\r\n", "HTTP/1.1 099 x\r\n"} {
		_, err := statusCode([]byte(in))
		assert.Assert(t, errors.Is(err, ErrBadHead), "%q", in)
	}
}

func TestValidBearerToken(t *testing.T) {
	assert.Assert(t, ValidBearerToken("abc.DEF-123_~+/="))
	for _, bad := range []string{"", "a b", "a\tb", "é", "a\r\nX-Evil: 1", strings.Repeat("a", 4097)} {
		assert.Assert(t, !ValidBearerToken(bad), "%q", bad)
	}
}

// FuzzRewriteRequestHead: no input panics, and an accepted head comes out
// well formed: one Host line, the upstream's, one Authorization line, the
// token's, no body headers, the start line untouched, and a fixed point of
// a second rewrite.
func FuzzRewriteRequestHead(f *testing.F) {
	f.Add([]byte("GET /ws HTTP/1.1\r\nHost: 10.0.2.2:49134\r\nAuthorization: Basic x\r\nUpgrade: websocket\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n"))
	f.Fuzz(func(t *testing.T, head []byte) {
		// Through readHead first, as the forward does.
		if h, err := readHead(bufio.NewReaderSize(bytes.NewReader(head), 16)); err == nil {
			head = h
		}
		out, _, err := RewriteRequestHead(head, "127.0.0.1:49134", "tok")
		if err != nil {
			return
		}
		lines, err := headLines(out)
		if err != nil {
			t.Fatalf("rewritten head is malformed: %v\n%q", err, out)
		}
		if !bytes.Equal(lines[0], bytes.SplitN(head, []byte("\r\n"), 2)[0]) {
			t.Fatalf("start line changed: %q", out)
		}
		auth, hosts := 0, 0
		for _, l := range lines[1:] {
			name, _, _ := bytes.Cut(l, []byte(":"))
			switch {
			case bytes.EqualFold(name, []byte("Host")):
				hosts++
				if string(l) != "Host: 127.0.0.1:49134" {
					t.Fatalf("foreign Host line %q", l)
				}
			case bytes.EqualFold(name, []byte("Authorization")):
				auth++
				if string(l) != "Authorization: Bearer tok" {
					t.Fatalf("foreign Authorization line %q", l)
				}
			case bytes.EqualFold(name, []byte("Transfer-Encoding")):
				t.Fatalf("Transfer-Encoding passed: %q", out)
			}
		}
		if auth != 1 || hosts != 1 {
			t.Fatalf("%d Authorization and %d Host lines in %q", auth, hosts, out)
		}
		again, _, err := RewriteRequestHead(out, "127.0.0.1:49134", "tok")
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("a second rewrite changed the head: %v\n%q\n%q", err, out, again)
		}
	})
}
