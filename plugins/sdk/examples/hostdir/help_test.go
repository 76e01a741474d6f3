package hostdir_test

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
)

// TestServeHelp runs the real sandbox-hostdir binary: `serve --help` and
// `--help` print every flag with its description on stdout and exit 0
// (not "flag: help requested"), the fleet flag included, and the
// configuration examples name hostdir's own presets.
func TestServeHelp(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "sandbox-hostdir")
	out, err := bins.GoBuild(bin, "./cmd/sandbox-hostdir", nil)
	assert.NilError(t, err, string(out))

	run := func(args ...string) (stdout, stderr string) {
		t.Helper()
		var o, e bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &o, &e
		assert.NilError(t, cmd.Run(), "%v: exit 0 expected; stderr:\n%s", args, e.String())
		return o.String(), e.String()
	}
	help, stderr := run("serve", "--help")
	assert.Check(t, is.Equal(stderr, ""))
	assert.Check(t, !strings.Contains(help, "help requested"))
	for _, want := range []string{
		"--engine URL", "--credential-file FILE", "--namespace NS", "--host-name NAME", "--config-file FILE", "--fleet\n",
		"serve as one host of a fleet", "III_ADAPTER_FLEET",
		"--host-name h1 --fleet",
		`{"image_allowlist":["python","node"]}`,
	} {
		assert.Check(t, is.Contains(help, want))
	}
	short, _ := run("serve", "-h")
	assert.Check(t, is.Equal(short, help))

	top, _ := run("--help")
	assert.Check(t, is.Contains(top, "image_allowlist: [python, node]"))
	assert.Check(t, is.Contains(top, "[--host-name NAME [--fleet]]"))
	assert.Check(t, is.Contains(top, "sandbox-hostdir serve --help"))

	// A bad flag still fails, and points at the help.
	var e bytes.Buffer
	cmd := exec.Command(bin, "serve", "--nope")
	cmd.Stderr = &e
	err = cmd.Run()
	var exit *exec.ExitError
	assert.Assert(t, errors.As(err, &exit), "serve --nope must fail: %v", err)
	assert.Check(t, is.Contains(e.String(), "--help describes every flag"))
}
