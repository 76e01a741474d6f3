package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/selfupdate"
)

// TestRun: the command line publishes what it is given, reports it, and
// refuses incomplete or bad input with exit 2 or 1.
func TestRun(t *testing.T) {
	bins := t.TempDir()
	iii := filepath.Join(bins, "iii")
	assert.NilError(t, os.WriteFile(iii, []byte("#!/bin/sh\necho 0.26.0\n"), 0o755))
	cloud := filepath.Join(bins, "cloud-build")
	assert.NilError(t, os.WriteFile(cloud, []byte("#!/bin/sh\necho 0.26.0\n"), 0o755))
	env := func(k string) string {
		if k == "SOURCE_DATE_EPOCH" {
			return "1767225600"
		}
		return ""
	}
	dir := filepath.Join(t.TempDir(), "releases")

	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		{name: "publish", args: []string{"-dir", dir, "-version", "v0.26.0", "-target", "x86_64-unknown-linux-gnu", iii, cloud + "=iii-cloud"}, code: 0,
			stdout: []string{"iii 0.26.0 (x86_64-unknown-linux-gnu): published, " + filepath.Join(dir, "0.26.0", "iii-x86_64-unknown-linux-gnu.tar.gz"), "iii-cloud 0.26.0 (x86_64-unknown-linux-gnu): published"}},
		{name: "again", args: []string{"-dir", dir, "-version", "0.26.0", "-target", "x86_64-unknown-linux-gnu", iii}, code: 0,
			stdout: []string{"iii 0.26.0 (x86_64-unknown-linux-gnu): unchanged"}},
		{name: "not latest", args: []string{"-dir", dir, "-version", "0.25.0", "-latest=false", "-target", "x86_64-unknown-linux-gnu", iii}, code: 0,
			stdout: []string{"iii 0.25.0"}},
		{name: "no binary", args: []string{"-dir", dir, "-version", "0.26.0"}, code: 2, stderr: "usage: publish-release"},
		{name: "no dir", args: []string{"-version", "0.26.0", iii}, code: 2, stderr: "usage: publish-release"},
		{name: "bad flag", args: []string{"-nope"}, code: 2, stderr: "flag provided but not defined"},
		{name: "bad version", args: []string{"-dir", dir, "-version", "0.26", iii}, code: 1, stderr: `version "0.26" is not MAJOR.MINOR.PATCH`},
		{name: "missing file", args: []string{"-dir", dir, "-version", "0.26.2", filepath.Join(bins, "nope")}, code: 1, stderr: "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			assert.Equal(t, run(tc.args, &stdout, &stderr, env), tc.code, stderr.String())
			for _, s := range tc.stdout {
				assert.Check(t, is.Contains(stdout.String(), s))
			}
			assert.Check(t, is.Contains(stderr.String(), tc.stderr))
		})
	}
	data, err := os.ReadFile(filepath.Join(dir, selfupdate.IndexFile))
	assert.NilError(t, err)
	idx, err := selfupdate.DecodeIndex(data, "published")
	assert.NilError(t, err)
	assert.Equal(t, idx.LatestVersion(), "0.26.0", "-latest=false left latest alone")
	assert.Equal(t, idx.Releases["0.26.0"].PublishedAt, "2026-01-01T00:00:00Z", "SOURCE_DATE_EPOCH stamps it")
	assert.DeepEqual(t, idx.Releases["0.26.0"].AssetNames(), []string{"iii-cloud-x86_64-unknown-linux-gnu.tar.gz", "iii-x86_64-unknown-linux-gnu.tar.gz"})
}
