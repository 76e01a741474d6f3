package selfupdate

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

type entry struct {
	name string
	typ  byte
	body string
	link string
}

func tarGz(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: 0o755, Linkname: e.link}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		assert.NilError(t, tw.WriteHeader(h))
		if typ == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			assert.NilError(t, err)
		}
	}
	assert.NilError(t, tw.Close())
	assert.NilError(t, zw.Close())
	return buf.Bytes()
}

// TestExtractBinary: the binary is taken from the top of the archive or
// one directory down, as a regular file; anything else is refused with
// the reason.
func TestExtractBinary(t *testing.T) {
	tests := []struct {
		name    string
		data    func(t *testing.T) []byte
		want    string
		wantErr string
	}{
		{name: "top", data: func(t *testing.T) []byte {
			return tarGz(t, entry{name: "README", body: "r"}, entry{name: "iii", body: "BINARY"})
		}, want: "BINARY"},
		{name: "dot slash", data: func(t *testing.T) []byte { return tarGz(t, entry{name: "./iii", body: "B2"}) }, want: "B2"},
		{name: "one dir down", data: func(t *testing.T) []byte {
			return tarGz(t, entry{name: "iii-x86_64-unknown-linux-gnu/", typ: tar.TypeDir}, entry{name: "iii-x86_64-unknown-linux-gnu/iii", body: "B3"})
		}, want: "B3"},
		{name: "first match wins", data: func(t *testing.T) []byte {
			return tarGz(t, entry{name: "iii", body: "first"}, entry{name: "d/iii", body: "second"})
		}, want: "first"},
		{name: "other name only", data: func(t *testing.T) []byte {
			return tarGz(t, entry{name: "iii-cloud", body: "x"}, entry{name: "iiii", body: "x"})
		},
			wantErr: "no file named iii at its top or one directory down (it holds iii-cloud, iiii)"},
		{name: "two dirs down", data: func(t *testing.T) []byte { return tarGz(t, entry{name: "a/b/iii", body: "x"}) }, wantErr: "no file named iii"},
		{name: "climbing", data: func(t *testing.T) []byte { return tarGz(t, entry{name: "../iii", body: "x"}) }, wantErr: "no file named iii"},
		{name: "symlink", data: func(t *testing.T) []byte { return tarGz(t, entry{name: "iii", typ: tar.TypeSymlink, link: "/bin/sh"}) }, wantErr: "not a regular file"},
		{name: "directory", data: func(t *testing.T) []byte { return tarGz(t, entry{name: "iii/", typ: tar.TypeDir}) }, wantErr: "not a regular file"},
		{name: "empty", data: func(t *testing.T) []byte { return tarGz(t) }, wantErr: "the archive is empty"},
		{name: "not gzip", data: func(*testing.T) []byte { return []byte("plain text") }, wantErr: "not a gzip file"},
		{name: "gzip of garbage", data: func(t *testing.T) []byte {
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			_, _ = zw.Write([]byte(strings.Repeat("x", 2000)))
			_ = zw.Close()
			return buf.Bytes()
		}, wantErr: "not a tar archive"},
		{name: "truncated", data: func(t *testing.T) []byte {
			d := tarGz(t, entry{name: "iii", body: strings.Repeat("y", 100000)})
			return d[:len(d)/2]
		}, wantErr: "reading iii from the archive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			n, err := extractBinary(bytes.NewReader(tc.data(t)), "iii", &out)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, out.String(), tc.want)
			assert.Equal(t, n, int64(len(tc.want)))
		})
	}
}

func TestListSome(t *testing.T) {
	assert.Equal(t, listSome([]string{"a", "b"}, 2), "a, b")
	assert.Check(t, is.Equal(listSome([]string{"a", "b"}, 12), "a, b and 10 more"))
}

// FuzzExtractBinary: any bytes as an archive: no panic, and what is
// written is never more than the entry the archive declares.
func FuzzExtractBinary(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("not gzip"))
	for _, e := range [][]entry{
		{{name: "iii", body: "BIN"}},
		{{name: "d/", typ: tar.TypeDir}, {name: "d/iii", body: "x"}},
		{{name: "iii", typ: tar.TypeSymlink, link: "x"}},
		{{name: "other", body: "y"}},
	} {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		for _, x := range e {
			typ := x.typ
			if typ == 0 {
				typ = tar.TypeReg
			}
			h := &tar.Header{Name: x.name, Typeflag: typ, Linkname: x.link, Mode: 0o755}
			if typ == tar.TypeReg {
				h.Size = int64(len(x.body))
			}
			_ = tw.WriteHeader(h)
			_, _ = tw.Write([]byte(x.body))
		}
		_ = tw.Close()
		_ = zw.Close()
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		n, err := extractBinary(bytes.NewReader(data), "iii", &out)
		if int64(out.Len()) != n {
			t.Fatalf("reported %d bytes, wrote %d", n, out.Len())
		}
		if err == nil && n > MaxBinaryBytes {
			t.Fatalf("wrote %d bytes", n)
		}
	})
}
