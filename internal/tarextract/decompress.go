package tarextract

import (
	"bufio"
	"bytes"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Decompress returns the tar stream inside a layer blob. The format is
// sniffed from the first bytes rather than trusted from the media type:
// registries and tools get media types wrong, the bytes do not lie.
// Uncompressed tar passes through.
func Decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(4)
	if err != nil && len(head) == 0 {
		if err == io.EOF {
			return io.NopCloser(br), nil // an empty layer is an empty tar
		}
		return nil, err
	}
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, nil
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// A bounded window keeps a hostile frame from allocating gigabytes.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(512<<20), zstd.WithDecoderMaxWindow(128<<20))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return zr.IOReadCloser(), nil
	default:
		return io.NopCloser(br), nil
	}
}
