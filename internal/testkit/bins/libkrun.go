package bins

import (
	"fmt"
	"path/filepath"
	"strings"
)

// SandboxLibkrun builds the shipped VM adapter into dir/sandbox-libkrun and
// its guest agent, a static Linux binary named agent (adapter.AgentName of
// the host's architecture), beside it, where the adapter looks first. The
// packages are found under root, the repository root (relative paths
// work); adapterFlags go to the adapter's build only (-race, for one).
// It returns the adapter's path.
//
// The agent's name is a parameter because this package must not import
// the adapter: the adapter's own tests use packages that import this one.
func SandboxLibkrun(root, dir, agent string, adapterFlags ...string) (string, error) {
	bin := filepath.Join(dir, "sandbox-libkrun")
	pkg := func(rel string) string {
		p := filepath.Join(root, rel)
		if !filepath.IsAbs(p) && !strings.HasPrefix(p, ".") {
			p = "." + string(filepath.Separator) + p // a directory, not an import path
		}
		return p
	}
	if out, err := GoBuild(bin, pkg("plugins/sandbox-libkrun/cmd/sandbox-libkrun"), nil, append([]string{"-trimpath"}, adapterFlags...)...); err != nil {
		return "", fmt.Errorf("build the adapter (run from the repository root): %v\n%s", err, out)
	}
	if out, err := GoBuild(filepath.Join(dir, agent), pkg("plugins/sandbox-libkrun/cmd/iii-guest-agent"),
		[]string{"CGO_ENABLED=0", "GOOS=linux"}, "-trimpath", "-ldflags=-s -w"); err != nil {
		return "", fmt.Errorf("build the guest agent: %v\n%s", err, out)
	}
	return bin, nil
}
