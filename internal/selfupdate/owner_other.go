//go:build !unix

package selfupdate

import "os"

// keepOwner has nothing to keep where files have no unix owner.
func keepOwner(*os.File, os.FileInfo) {}
