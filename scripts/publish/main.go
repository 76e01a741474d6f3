// Command publish writes a package version into a local directory
// registry (the format of docs/packages.md). `make build` runs it to
// publish the freshly built sandbox-libkrun into bin/registry, the default
// registry of the iii beside it, so `package://sandbox-libkrun` resolves
// with no network:
//
//	go run ./scripts/publish -registry bin/registry -name sandbox-libkrun \
//	    -version 0.3.1 -default-config '{"auto_install":true,...}' \
//	    bin/sandbox-libkrun bin/iii-guest-agent-linux-amd64
//
// The artefact is a deterministic .tar.gz of the files, side by side. The
// target is the host's Rust target triple unless -target says otherwise.
// Publishing the same files again changes nothing.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose/registry"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("registry", "", "the registry directory (created when missing)")
	name := fs.String("name", "", "the package name")
	version := fs.String("version", "", "the version, MAJOR.MINOR.PATCH")
	kind := fs.String("kind", registry.KindBinary, "binary or bundle")
	desc := fs.String("description", "", "the package description")
	target := fs.String("target", "", "the Rust target triple (default: this host's)")
	cfg := fs.String("default-config", "", "the default configuration: JSON, or @FILE holding JSON")
	var tags, deps multi
	fs.Var(&tags, "tag", "point this tag at the version (repeatable; default latest)")
	fs.Var(&deps, "dependency", "NAME=SELECTOR, a package this version needs (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: publish -registry DIR -name NAME -version VERSION [flags] FILE[=NAME_IN_ARCHIVE]...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *name == "" || *version == "" || fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	p := registry.Publication{Name: *name, Description: *desc, Kind: *kind, Version: *version, Target: *target, Now: now()}
	if p.Target == "" {
		p.Target = registry.HostPlatform().Target()
	}
	for _, a := range fs.Args() {
		path, inArchive, _ := strings.Cut(a, "=")
		p.Files = append(p.Files, registry.PublishFile{Path: path, ArchiveName: inArchive})
	}
	if *cfg != "" {
		raw := []byte(*cfg)
		if file, ok := strings.CutPrefix(*cfg, "@"); ok {
			var err error
			if raw, err = os.ReadFile(file); err != nil {
				fmt.Fprintln(stderr, "publish:", err)
				return 1
			}
		}
		if !json.Valid(raw) {
			fmt.Fprintln(stderr, "publish: -default-config is not valid JSON")
			return 2
		}
		p.DefaultConfig = raw
	}
	if len(deps) > 0 {
		p.Dependencies = map[string]string{}
		for _, d := range deps {
			n, sel, ok := strings.Cut(d, "=")
			if !ok {
				fmt.Fprintf(stderr, "publish: -dependency %q is not NAME=SELECTOR\n", d)
				return 2
			}
			p.Dependencies[n] = sel
		}
	}
	p.Tags = tags
	if len(p.Tags) == 0 {
		p.Tags = []string{registry.TagLatest}
	}
	res, err := registry.Publish(*dir, p)
	if err != nil {
		fmt.Fprintln(stderr, "publish:", err)
		return 1
	}
	state := "unchanged"
	if res.Changed {
		state = "published"
	}
	fmt.Fprintf(stdout, "%s %s (%s): %s, sha256 %s, %d bytes, in %s\n", p.Name, p.Version, p.Target, state, res.SHA256, res.Size, res.IndexPath)
	return 0
}

// now is SOURCE_DATE_EPOCH when set (reproducible builds), else the clock.
func now() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
		fmt.Fprintln(os.Stderr, "publish:", errors.New("SOURCE_DATE_EPOCH is not a number; using the clock"))
	}
	return time.Now().UTC()
}
