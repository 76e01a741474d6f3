package examples

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runBlock is the shell block of doc marked `<!-- run: name -->`: the
// marker, then a fenced sh block, both possibly indented (inside a list
// item); the block's lines lose that indent.
func runBlock(doc, name string) (string, error) {
	lines := strings.Split(doc, "\n")
	marker := "<!-- run: " + name + " -->"
	for i, l := range lines {
		if strings.TrimSpace(l) != marker {
			continue
		}
		if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "```sh" {
			return "", fmt.Errorf("%s:%d: %s must be followed by a ```sh block", docFile, i+1, marker)
		}
		indent := lines[i+1][:len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " "))]
		var body []string
		for _, b := range lines[i+2:] {
			if strings.TrimSpace(b) == "```" {
				return strings.Join(body, "\n") + "\n", nil
			}
			body = append(body, strings.TrimPrefix(b, indent))
		}
		return "", fmt.Errorf("%s:%d: the block after %s is not closed", docFile, i+1, marker)
	}
	return "", fmt.Errorf("%s has no %s", docFile, marker)
}

// This package's tests use the standard testing package only:
// gotest.tools registers its own -update flag, which TestWalkthroughDoc's
// would collide with.

func TestRunBlock(t *testing.T) {
	t.Parallel()
	doc := "x\n  <!-- run: a -->\n  ```sh\n  echo 1\n    echo 2\n  ```\n<!-- run: open -->\n```sh\necho\n<!-- run: bare -->\ntext\n"
	got, err := runBlock(doc, "a")
	if err != nil || got != "echo 1\n  echo 2\n" {
		t.Fatalf("runBlock(a) = %q, %v", got, err)
	}
	for name, want := range map[string]string{"open": "not closed", "bare": "must be followed by a ```sh block", "missing": "has no <!-- run: missing -->"} {
		if _, err := runBlock(doc, name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("runBlock(%s) = %v, want an error containing %q", name, err, want)
		}
	}
}

// must fails the test on err.
func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestOfflineTidyRecipe runs docs/writing-an-adapter.md's offline go.sum
// recipe as written, from an EMPTY module cache: the "seed" block in the
// checkout (the only step that may reach a module source: the machine's
// own module cache, then the usual GOPROXY), then, with GOPROXY=off, the
// "tidy" block in a copy of the walkthrough module whose replace points at
// this checkout. The result must be the walkthrough's go.mod and go.sum,
// and the module must vet offline with -mod=readonly.
func TestOfflineTidyRecipe(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("downloads every module of the checkout into an empty module cache")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	docB, err := os.ReadFile(filepath.Join(repoRoot, docFile))
	must(t, err, "read the doc")
	seed, err := runBlock(string(docB), "seed")
	must(t, err, "the seed block")
	tidy, err := runBlock(string(docB), "tidy")
	must(t, err, "the tidy block")
	root, err := filepath.Abs(repoRoot)
	must(t, err, "the checkout")
	const replacePath = "../../../.."
	if !strings.Contains(tidy, replacePath) {
		t.Fatalf("the tidy block does not copy go.sum from the replace's path %s:\n%s", replacePath, tidy)
	}

	cache := t.TempDir()
	// Where the seed step may download from: this machine's module cache
	// as a file proxy, then the proxy the environment names.
	realCache := strings.TrimSpace(goEnv(t, "GOMODCACHE"))
	proxy := "file://" + filepath.Join(realCache, "cache", "download")
	if p := strings.TrimSpace(goEnv(t, "GOPROXY")); p != "" && p != "off" {
		proxy += "," + p
	}
	base := []string{"GOMODCACHE=" + cache, "GOWORK=off", "GOTOOLCHAIN=local", "GOFLAGS=-modcacherw"}
	env := func(extra ...string) []string {
		var out []string
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			switch k {
			case "GOMODCACHE", "GOWORK", "GOTOOLCHAIN", "GOFLAGS", "GOPROXY", "MAKEFLAGS", "MAKELEVEL", "MFLAGS":
				continue
			}
			out = append(out, kv)
		}
		return append(append(out, base...), extra...)
	}
	sh := func(dir, script string, env []string) string {
		t.Helper()
		cmd := exec.Command("/bin/sh", "-ec", script)
		cmd.Dir, cmd.Env = dir, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("in %s:\n%s\n%v\n%s", dir, script, err, out.String())
		}
		return out.String()
	}
	if entries, err := os.ReadDir(cache); err != nil || len(entries) != 0 {
		t.Fatalf("the module cache does not start empty: %v %v", entries, err)
	}

	sh(root, seed, env("GOPROXY="+proxy, "GOFLAGS=-modcacherw"))

	mod := t.TempDir()
	src := filepath.Join(root, moduleDir)
	must(t, os.CopyFS(mod, os.DirFS(src)), "copy the walkthrough module")
	must(t, os.Remove(filepath.Join(mod, "go.sum")), "remove its go.sum")
	wantMod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	must(t, err, "read go.mod")
	must(t, os.WriteFile(filepath.Join(mod, "go.mod"), bytes.Replace(wantMod, []byte("=> "+replacePath), []byte("=> "+root), 1), 0o644), "write go.mod")

	// Offline from here on: GOPROXY=off for every step, whatever the block says.
	out := sh(mod, strings.ReplaceAll(tidy, replacePath, root), env("GOPROXY=off"))
	t.Logf("tidy:\n%s", out)

	gotMod, err := os.ReadFile(filepath.Join(mod, "go.mod"))
	must(t, err, "read the result's go.mod")
	if got := string(bytes.Replace(gotMod, []byte("=> "+root), []byte("=> "+replacePath), 1)); got != string(wantMod) {
		t.Errorf("the recipe's go.mod is not the page's:\n%s\nwant:\n%s", got, wantMod)
	}
	gotSum, err := os.ReadFile(filepath.Join(mod, "go.sum"))
	must(t, err, "read the result's go.sum")
	wantSum, err := os.ReadFile(filepath.Join(src, "go.sum"))
	must(t, err, "read the walkthrough's go.sum")
	if string(gotSum) != string(wantSum) {
		t.Errorf("the recipe's go.sum is not the walkthrough's:\n%s\nwant:\n%s", gotSum, wantSum)
	}
	sh(mod, "go vet ./...", env("GOPROXY=off", "GOFLAGS=-mod=readonly -modcacherw"))
}

func goEnv(t *testing.T, key string) string {
	t.Helper()
	out, err := exec.Command(goTool(), "env", key).Output()
	must(t, err, "go env "+key)
	return string(out)
}
