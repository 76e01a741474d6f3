package selfupdate

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/klauspost/compress/gzip"
)

// maxStreamBytes bounds how much of an archive is decompressed while the
// binary is looked for, so a small archive cannot unpack without end.
const maxStreamBytes = 2*MaxBinaryBytes + 1<<20

// extractBinary copies the file named name (iii, iii-cloud) out of a
// gzip'd tar into dst. The file sits at the top of the archive or in one
// directory (iii-<target>/iii); it must be a regular file. Nothing else
// in the archive is written anywhere, so its other entries cannot escape.
func extractBinary(r io.Reader, name string, dst io.Writer) (int64, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return 0, fmt.Errorf("not a gzip file: %w", err)
	}
	defer zr.Close()
	tr := tar.NewReader(&capReader{r: zr, left: maxStreamBytes})
	// A few names are kept for the message; the rest are only counted.
	var seen []string
	count := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if count == 0 {
				return 0, errors.New("the archive is empty")
			}
			return 0, fmt.Errorf("it holds no file named %s at its top or one directory down (it holds %s)", name, listSome(seen, count))
		}
		if err != nil {
			return 0, fmt.Errorf("not a tar archive: %w", err)
		}
		clean := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if count++; len(seen) < maxListed {
			seen = append(seen, clip(clean, 80))
		}
		if path.Base(clean) != name || strings.Count(clean, "/") > 1 || strings.HasPrefix(clean, "../") || strings.HasPrefix(clean, "/") {
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			return 0, fmt.Errorf("%s in the archive is not a regular file", clip(hdr.Name, 120))
		}
		if hdr.Size > MaxBinaryBytes {
			return 0, fmt.Errorf("%s in the archive is larger than %d MiB", clip(hdr.Name, 120), MaxBinaryBytes>>20)
		}
		n, err := io.CopyN(dst, tr, hdr.Size)
		if err != nil {
			return n, fmt.Errorf("reading %s from the archive: %w", clip(hdr.Name, 120), err)
		}
		return n, nil
	}
}

// maxListed is how many entry names a message lists.
const maxListed = 8

// listSome lists the names kept of count entries.
func listSome(names []string, count int) string {
	if count <= len(names) {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names, ", "), count-len(names))
}

// capReader fails once more than left bytes were read.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("the archive unpacks to more than %d MiB", maxStreamBytes>>20)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}
