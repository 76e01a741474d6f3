//go:build !unix

package sdk

import (
	"errors"
	"os"
)

// protectStdout on systems without Unix file descriptors can only guard
// the os.Stdout variable; the caller does that. The real stdout is the
// handshake channel.
func protectStdout() (*os.File, error) { return os.Stdout, nil }

// inheritFD is not supported: the lifeline is a Unix pipe.
func inheritFD(fd int, name string) (*os.File, error) {
	return nil, errors.New("an inherited lifeline descriptor needs a Unix system")
}
