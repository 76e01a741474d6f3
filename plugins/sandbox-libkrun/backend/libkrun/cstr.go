//go:build linux || darwin

package libkrun

import (
	"fmt"
	"strings"
	"unsafe"
)

// arena owns every C string and array passed to libkrun. libkrun copies
// most of them, but not all versions document it, and krun_start_enter
// never returns: Boot keeps the arena reachable (runtime.KeepAlive after
// the call), so nothing handed to C is collected while C may read it. The
// Go GC does not move heap objects, so the addresses stay valid.
//
// Arrays hold addresses as uintptr, not Go pointers: the memory C reads
// then contains no Go pointers (the cgo rule), and the arena's own
// references to the byte slices keep those alive.
type arena struct {
	bufs   [][]byte
	arrays [][]uintptr
}

// str returns a NUL-terminated copy of s. s must not hold a NUL byte.
func (a *arena) str(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	a.bufs = append(a.bufs, b)
	return &b[0]
}

// strOrNil is str, except that "" becomes NULL: libkrun treats an empty
// path as a path (krun_set_kernel would try to open "" as the initramfs).
func (a *arena) strOrNil(s string) *byte {
	if s == "" {
		return nil
	}
	return a.str(s)
}

// strv returns a NULL-terminated array of C strings. It is never NULL, even
// for no strings: libkrun reads a NULL environment as "copy the host's".
func (a *arena) strv(ss []string) unsafe.Pointer {
	arr := make([]uintptr, len(ss)+1)
	for i, s := range ss {
		arr[i] = uintptr(unsafe.Pointer(a.str(s)))
	}
	a.arrays = append(a.arrays, arr)
	return unsafe.Pointer(&arr[0])
}

// bytes returns a copy of b that stays alive with the arena.
func (a *arena) bytes(b []byte) *byte {
	c := make([]byte, len(b)+1) // +1: never a zero-length slice to index
	copy(c, b)
	a.bufs = append(a.bufs, c)
	return &c[0]
}

// checkCString rejects strings C would truncate.
func checkCString(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%s holds a NUL byte", what)
	}
	return nil
}
