package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/selfupdate"
)

// TestUpdateScripts runs testdata/update/*.txtar: `iii update` for real.
// Two iii binaries are built from this tree with their versions linked
// in, published with the scripts/publish-release logic into a release
// directory (0.26.0: iii; 0.26.1, latest: iii and a stand-in iii-cloud),
// and that directory is also served over loopback HTTP. The scripts copy
// a binary somewhere, run its `update`, and run the result. Variables:
//
//	III_0260, III_0261  the built binaries (--version prints 0.26.0, 0.26.1)
//	CLOUD_0261          the iii-cloud stand-in of release 0.26.1
//	RELEASES            the release directory
//	BAD_RELEASES        the same, with one byte of 0.26.1's iii archive flipped
//	RELEASE_URL         RELEASES over HTTP
//	TARGET              this host's target triple
//	SCRATCH             an empty directory every user can enter (for
//	                    running as an unprivileged user)
//
// The condition [root] holds when the tests run as root, where file
// permissions do not stop anything: scripts then drop to nobody with
// setpriv.
func TestUpdateScripts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bins := map[string]string{}
	for _, v := range []string{"0.26.0", "0.26.1"} {
		out := filepath.Join(dir, "build", v, "iii")
		cmd := exec.Command("go", "build", "-o", out, "-ldflags", "-X github.com/iii-sandbox/iii/internal/version.Version="+v, "github.com/iii-sandbox/iii/cmd/iii")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build iii %s: %v\n%s", v, err, b)
		}
		bins[v] = out
	}
	cloud := filepath.Join(dir, "build", "cloud", "iii-cloud")
	assert.NilError(t, os.MkdirAll(filepath.Dir(cloud), 0o755))
	assert.NilError(t, os.WriteFile(cloud, []byte("#!/bin/sh\necho iii-cloud 0.26.1\n"), 0o755))

	target := selfupdate.HostTarget(os.Getenv)
	releases := filepath.Join(dir, "releases")
	for _, p := range []selfupdate.Publication{
		{Version: "0.26.0", Binaries: []selfupdate.PublishBinary{{Path: bins["0.26.0"]}}},
		{Version: "0.26.1", Binaries: []selfupdate.PublishBinary{{Path: bins["0.26.1"]}, {Path: cloud}}, Latest: true},
	} {
		p.Target = target
		_, err := selfupdate.Publish(releases, p)
		assert.NilError(t, err)
	}
	bad := filepath.Join(dir, "bad-releases")
	assert.NilError(t, os.CopyFS(bad, os.DirFS(releases)))
	asset := filepath.Join(bad, "0.26.1", selfupdate.AssetName("iii", target))
	data, err := os.ReadFile(asset)
	assert.NilError(t, err)
	data[len(data)/2] ^= 0x01
	assert.NilError(t, os.WriteFile(asset, data, 0o644))

	srv := httptest.NewServer(http.FileServer(http.Dir(releases)))
	t.Cleanup(srv.Close)
	_, setprivErr := exec.LookPath("setpriv")

	testscript.Run(t, testscript.Params{
		Dir: "testdata/update",
		Setup: func(e *testscript.Env) error {
			scratch, err := os.MkdirTemp("", "iii-update-")
			if err != nil {
				return err
			}
			e.Defer(func() { _ = os.RemoveAll(scratch) })
			if err := os.Chmod(scratch, 0o755); err != nil {
				return err
			}
			for k, v := range map[string]string{
				"III_0260": bins["0.26.0"], "III_0261": bins["0.26.1"], "CLOUD_0261": cloud,
				"RELEASES": releases, "BAD_RELEASES": bad, "RELEASE_URL": srv.URL,
				"TARGET": target, "SCRATCH": scratch,
			} {
				e.Setenv(k, v)
			}
			return nil
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "root":
				return os.Geteuid() == 0, nil
			case "setpriv":
				return setprivErr == nil, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"exitcode":   cmdExitCode,
			"cmpenvfrom": cmdCmpEnvFrom,
			"cpexe":      cmdCpExe,
		},
	})
}

// cmdCpExe copies an executable that the script runs next, keeping its
// mode:
//
//	cpexe SRC DST
//
// The copy is made by a cp child process. testscript's own cp writes the
// file in this process, and a script running in parallel that forks while
// the file is open gives its child the descriptor until that child execs:
// running the copy in that moment fails with "text file busy" (ETXTBSY).
func cmdCpExe(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: cpexe SRC DST")
	}
	out, err := exec.Command("cp", ts.MkAbs(args[0]), ts.MkAbs(args[1])).CombinedOutput()
	if err != nil {
		ts.Fatalf("cp %s %s: %v\n%s", args[0], args[1], err, out)
	}
}

// cmdCmpEnvFrom is cmpfrom with $VARIABLES in FILE expanded first:
//
//	cmpenvfrom REGEX FILE
func cmdCmpEnvFrom(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: cmpenvfrom REGEX FILE")
	}
	re, err := regexp.Compile("(?m)" + args[0])
	ts.Check(err)
	out := ts.ReadFile("stdout")
	loc := re.FindStringIndex(out)
	if loc == nil {
		ts.Fatalf("no line of stdout matches %q", args[0])
	}
	got, want := out[loc[0]:], os.Expand(ts.ReadFile(args[1]), ts.Getenv)
	if got != want {
		ts.Fatalf("stdout from %q differs from %s:\n--- got\n%s--- want\n%s", args[0], args[1], got, want)
	}
}
