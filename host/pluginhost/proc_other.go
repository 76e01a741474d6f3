//go:build !unix

package pluginhost

import "os/exec"

// ownProcessGroup: process groups are a Unix notion; elsewhere go-plugin's
// Kill of the adapter process is all there is.
func ownProcessGroup(*exec.Cmd) {}

func killProcessGroup(int) {}
