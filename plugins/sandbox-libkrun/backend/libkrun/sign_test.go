//go:build linux || darwin

package libkrun

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// fakeCodesign writes a codesign stand-in: signing records its arguments
// and the entitlements file; "-d --entitlements -" prints what was
// recorded, or nothing in strip mode (what an ad-hoc re-sign without
// --entitlements leaves).
func fakeCodesign(t *testing.T, strip bool) (dir string) {
	t.Helper()
	dir = t.TempDir()
	show := `cat "$state/ent" 2>/dev/null`
	if strip {
		show = "true"
	}
	script := "#!/bin/sh\nstate=" + dir + "\n" +
		"if [ \"$1\" = -d ]; then " + show + "; exit 0; fi\n" +
		"echo \"$@\" > \"$state/args\"\n" +
		"while [ $# -gt 0 ]; do if [ \"$1\" = --entitlements ]; then cp \"$2\" \"$state/ent\"; fi; shift; done\n"
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "codesign"), []byte(script), 0o755))
	return dir
}

func runSign(t *testing.T, fakeDir string, env []string, args ...string) (string, error) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", "..", "..", "scripts", "macos-sign.sh"))
	assert.NilError(t, err)
	cmd := exec.Command("bash", append([]string{script}, args...)...)
	cmd.Env = append(append(os.Environ(), "PATH="+fakeDir+":"+os.Getenv("PATH")), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestMacOSSignScript(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not installed")
	}
	bin := filepath.Join(t.TempDir(), "sandbox-libkrun")
	assert.NilError(t, os.WriteFile(bin, []byte("binary"), 0o755))

	t.Run("signs and verifies", func(t *testing.T) {
		dir := fakeCodesign(t, false)
		out, err := runSign(t, dir, nil, bin)
		assert.NilError(t, err, out)
		args, err := os.ReadFile(filepath.Join(dir, "args"))
		assert.NilError(t, err)
		assert.Check(t, is.Contains(string(args), "--force --entitlements "))
		assert.Check(t, is.Contains(string(args), "hvf-entitlements.plist --sign - "+bin))
		assert.Check(t, !strings.Contains(string(args), "--options runtime"))
		assert.Check(t, is.Contains(out, "signed with hvf-entitlements.plist"))
	})
	t.Run("identity and hardened runtime", func(t *testing.T) {
		dir := fakeCodesign(t, false)
		out, err := runSign(t, dir, []string{"CODESIGN_IDENTITY=Developer ID", "HARDENED=1"}, bin)
		assert.NilError(t, err, out)
		args, _ := os.ReadFile(filepath.Join(dir, "args"))
		assert.Check(t, is.Contains(string(args), "--sign Developer ID --options runtime "+bin))
	})
	t.Run("entitlements missing after signing", func(t *testing.T) {
		out, err := runSign(t, fakeCodesign(t, true), nil, bin)
		assert.Assert(t, err != nil)
		assert.Check(t, is.Contains(out, "lacks com.apple.security.hypervisor"))
		assert.Check(t, is.Contains(out, "lacks com.apple.security.cs.disable-library-validation"))
	})
	t.Run("usage", func(t *testing.T) {
		out, err := runSign(t, fakeCodesign(t, false), nil)
		assert.Assert(t, err != nil)
		assert.Check(t, is.Contains(out, "usage:"))
		out, err = runSign(t, fakeCodesign(t, false), nil, bin+".missing")
		assert.Assert(t, err != nil)
		assert.Check(t, is.Contains(out, "no such file"))
	})
	t.Run("no codesign", func(t *testing.T) {
		cmdPath, _ := filepath.Abs(filepath.Join("..", "..", "..", "..", "scripts", "macos-sign.sh"))
		cmd := exec.Command("/bin/bash", cmdPath, bin)
		cmd.Env = []string{"PATH=" + t.TempDir() + ":/usr/bin:/bin"}
		if _, err := exec.LookPath("codesign"); err == nil {
			t.Skip("a real codesign is installed")
		}
		out, err := cmd.CombinedOutput()
		assert.Assert(t, err != nil)
		assert.Check(t, is.Contains(string(out), "codesign not found"))
	})
}
