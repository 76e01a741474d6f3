//go:build !unix

package engine

import (
	"io/fs"
	"os"
)

// openNoFollow opens path for reading.
func openNoFollow(path string) (*os.File, error) { return os.Open(path) }

// fileOwner is unknown here.
func fileOwner(fs.FileInfo) (int, bool) { return 0, false }
