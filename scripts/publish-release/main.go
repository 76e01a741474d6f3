// Command publish-release writes a release of iii into a release
// directory, the format `iii update` reads (docs/update.md):
//
//	go run ./scripts/publish-release -dir bin/releases -version 0.26.0 bin/iii
//
// Each binary becomes <dir>/<version>/<product>-<target>.tar.gz (the
// product is the file's base name: iii, iii-cloud; a deterministic
// archive, so the same binary gives the same digest) and an entry in
// <dir>/index.json with its sha256 and size. The target is this host's
// Rust target triple unless -target says otherwise; -latest (on by
// default) points latest at the version. Publishing the same files again
// changes nothing. Serve the directory with any static file server, or
// pass it to `iii update --source DIR`.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/selfupdate"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("publish-release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "the release directory (created when missing)")
	version := fs.String("version", "", "the release version, MAJOR.MINOR.PATCH")
	target := fs.String("target", "", "the Rust target triple of the binaries (default: this host's)")
	latest := fs.Bool("latest", true, "point latest at this version")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: publish-release -dir DIR -version VERSION [-target TRIPLE] [-latest=false] BINARY[=PRODUCT]...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *version == "" || fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	p := selfupdate.Publication{Version: selfupdate.NormalizeVersion(*version), Target: *target, Latest: *latest, Now: now(getenv, stderr)}
	if p.Target == "" {
		p.Target = registry.HostPlatform().Target()
	}
	for _, a := range fs.Args() {
		path, product, _ := strings.Cut(a, "=")
		p.Binaries = append(p.Binaries, selfupdate.PublishBinary{Path: path, Product: product})
	}
	out, err := selfupdate.Publish(*dir, p)
	if err != nil {
		fmt.Fprintln(stderr, "publish-release:", err)
		return 1
	}
	for _, a := range out {
		state := "unchanged"
		if a.Changed {
			state = "published"
		}
		fmt.Fprintf(stdout, "%s %s (%s): %s, %s, sha256 %s, %d bytes\n", a.Product, p.Version, p.Target, state, a.Path, a.SHA256, a.Size)
	}
	return 0
}

// now is SOURCE_DATE_EPOCH when set (reproducible builds), else the clock.
func now(getenv func(string) string, stderr io.Writer) time.Time {
	if s := getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
		fmt.Fprintln(stderr, "publish-release:", errors.New("SOURCE_DATE_EPOCH is not a number; using the clock"))
	}
	return time.Now().UTC()
}
