//go:build !unix

package enginetoken

import (
	"io/fs"
	"os"
)

func openNoFollow(path string) (*os.File, error) { return os.Open(path) }

// fileOwner: no uid here; the mode check alone applies.
func fileOwner(fs.FileInfo) (int, bool) { return 0, false }
