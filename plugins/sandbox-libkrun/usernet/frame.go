package usernet

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The NIC's byte stream, as QEMU's `-netdev socket`/`-netdev stream` and
// libkrun's krun_add_net_unixstream (passt's "qemu" mode) carry it: each
// Ethernet frame (no virtio-net header) preceded by its length as a 32-bit
// big-endian number.
const (
	frameHeaderLen = 4
	// MaxFrame is the largest frame accepted: an Ethernet header, an
	// 802.1Q tag and the largest IPv4 packet (a guest with segmentation
	// offload sends whole 64 KiB segments).
	MaxFrame = 14 + 4 + 65535
	// ethHeaderLen is the smallest useful frame.
	ethHeaderLen = 14
)

// ErrFrameTooLarge is a length prefix above MaxFrame: the stream cannot be
// trusted past it, so the reader stops.
var ErrFrameTooLarge = errors.New("frame length above the maximum")

// FrameReader reads length-prefixed frames.
type FrameReader struct {
	r   *bufio.Reader
	buf []byte
}

// NewFrameReader reads frames from r.
func NewFrameReader(r io.Reader) *FrameReader {
	return &FrameReader{r: bufio.NewReaderSize(r, 64<<10), buf: make([]byte, MaxFrame)}
}

// Next returns the next frame, which stays valid until the next call. A
// frame may be empty or shorter than an Ethernet header; the caller drops
// those. io.EOF means the stream ended between frames; a stream that ends
// inside one is io.ErrUnexpectedEOF.
func (fr *FrameReader) Next() ([]byte, error) {
	var hdr [frameHeaderLen]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrFrameTooLarge, n, MaxFrame)
	}
	b := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return b, nil
}

// WriteFrame writes one frame made of parts (the slices of one packet) to
// w, preceded by its length.
func WriteFrame(w io.Writer, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n > MaxFrame {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrFrameTooLarge, n, MaxFrame)
	}
	var hdr [frameHeaderLen]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(n))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}
