package workervm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"slices"
	"strings"
)

// What a worker's install step depends on, so a kept disk runs it again
// when one of them changes and skips it otherwise. The record of the last
// install that succeeded lives on the worker's disk (installMarker); the
// inputs are computed on the host from what the host sent, never read back
// from the guest.
//
// Only the dependency manifests at the top of the workspace count, not
// every file: an edit to the code must not make each warm start pay for
// an install (minutes under TCG). An install that reads other files (an
// archive the project ships) runs again when its command's text changes.

// installManifests are the dependency manifests and lock files, at the
// top of a worker's directory, whose bytes are inputs of its install
// step; requirements*.txt matches as a pattern.
var installManifests = []string{
	// JavaScript: npm, Yarn, pnpm, Bun.
	"package.json", "package-lock.json", "npm-shrinkwrap.json", ".npmrc",
	"yarn.lock", "pnpm-lock.yaml", "pnpm-workspace.yaml", "bun.lock", "bun.lockb",
	// Python: pip, Poetry, uv, Pipenv, setuptools.
	"requirements*.txt", "constraints.txt", "pyproject.toml", "poetry.lock", "uv.lock",
	"Pipfile", "Pipfile.lock", "setup.py", "setup.cfg",
	// Go, Ruby, Rust.
	"go.mod", "go.sum", "Gemfile", "Gemfile.lock", "Cargo.toml", "Cargo.lock",
}

// InstallManifests lists the names (and patterns) of the files whose
// content keys a VM worker's install step, for the docs and the tests.
func InstallManifests() []string { return slices.Clone(installManifests) }

// isInstallManifest reports whether rel, a slash path relative to the
// worker's directory, is one of installManifests at its top.
func isInstallManifest(rel string) bool {
	if strings.Contains(rel, "/") {
		return false
	}
	for _, m := range installManifests {
		if ok, _ := path.Match(m, rel); ok {
			return true
		}
	}
	return false
}

// engineAddressEnv are the variables that say where the engine listens.
// They are left out of the install's inputs: an engine on another port
// changes no dependency.
var engineAddressEnv = []string{"III_URL", "III_ENGINE_URL"}

// Names of the inputs besides the manifests (which go by file name).
const (
	inputCommand = "command"
	inputEnv     = "environment"
	inputImage   = "image"
	inputFile    = "file:"
)

// installInputs maps each input of an install step to the hex sha256 of
// its content: the command, the environment, the image's digest and each
// manifest ("file:<name>").
type installInputs map[string]string

func hexSum(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// newInstallInputs keys an install step: command runs with env in the
// image imageDigest, over a workspace whose manifests (name → hex sha256
// of the bytes copied) are given.
func newInstallInputs(command string, env []string, imageDigest string, manifests map[string]string) installInputs {
	var kept []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(engineAddressEnv, k) {
			kept = append(kept, kv)
		}
	}
	slices.Sort(kept)
	in := installInputs{
		inputCommand: hexSum(command),
		inputEnv:     hexSum(kept...),
		inputImage:   hexSum(imageDigest),
	}
	for name, sum := range manifests {
		in[inputFile+name] = sum
	}
	return in
}

// installRecordHeader starts the record; a disk whose record lacks it was
// installed by an adapter that keyed on the command alone.
const installRecordHeader = "iii-install-inputs 1"

// encode is the record written to the disk: the header, then one
// "<input> <sha256>" line per input, sorted.
func (in installInputs) encode() string {
	names := make([]string, 0, len(in))
	for n := range in {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString(installRecordHeader + "\n")
	for _, n := range names {
		fmt.Fprintf(&b, "%s %s\n", n, in[n])
	}
	return b.String()
}

// parseInstallRecord reads a record encode wrote; false when s is not one
// (an older adapter's record, or damage).
func parseInstallRecord(s string) (installInputs, bool) {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) == 0 || lines[0] != installRecordHeader {
		return nil, false
	}
	in := installInputs{}
	for _, l := range lines[1:] {
		n, sum, ok := strings.Cut(l, " ")
		if !ok || n == "" || sum == "" {
			return nil, false
		}
		in[n] = sum
	}
	return in, true
}

// changed names the inputs that differ between the record have and want,
// sorted, manifests by file name; empty when the install is done.
func (want installInputs) changed(have installInputs) []string {
	var out []string
	for n, sum := range want {
		if have[n] != sum {
			out = append(out, strings.TrimPrefix(n, inputFile))
		}
	}
	for n := range have {
		if _, ok := want[n]; !ok {
			out = append(out, strings.TrimPrefix(n, inputFile))
		}
	}
	slices.Sort(out)
	return out
}

// installReason says why an install step runs, for the worker's log;
// "" when the record shows it done with these inputs. present is whether
// the disk holds a record at all.
func installReason(want installInputs, record string, present bool) string {
	if !present {
		return "first install on this disk"
	}
	have, ok := parseInstallRecord(record)
	if !ok {
		return "inputs changed (the record on this disk is from an earlier version, which keyed on the command alone)"
	}
	if ch := want.changed(have); len(ch) > 0 {
		return "inputs changed (" + strings.Join(ch, ", ") + ")"
	}
	return ""
}
