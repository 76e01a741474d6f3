// Command imagebuild builds the sandbox preset images (python, node) from
// Debian packages, with no container registry: apt resolves and downloads
// each image's package closure into a cache, dpkg-deb unpacks it into a
// root file system, and the root is written as a one-layer OCI image into
// the local OCI layout the image store reads (~/.iii/cache/oci), named by
// the preset's public reference. scripts/build-images.sh runs it.
//
// A second run with the same inputs (image recipes, apt package lists,
// downloaded .debs) does nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func run() error {
	home, err := os.UserHomeDir()
	if err != nil {
		return err
	}
	cache := filepath.Join(home, ".iii", "cache")
	var (
		layoutDir = flag.String("layout", filepath.Join(cache, "oci"), "local OCI layout to install the images into")
		workDir   = flag.String("cache", filepath.Join(cache, "imagebuild"), "cache of .deb files and build state")
		only      = flag.String("images", "python,node", "comma-separated presets to build")
		check     = flag.Bool("check", os.Geteuid() == 0, "run each image's smoke test in a chroot of its root (needs root)")
		force     = flag.Bool("force", false, "rebuild even when the inputs are unchanged")
		quiet     = flag.Bool("q", false, "print only errors and the summary")
	)
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	b := &builder{
		layout: *layoutDir,
		work:   *workDir,
		check:  *check,
		force:  *force,
		logf: func(format string, args ...any) {
			if !*quiet {
				fmt.Printf("imagebuild: "+format+"\n", args...)
			}
		},
	}
	if *check && os.Geteuid() != 0 {
		return fmt.Errorf("-check needs root (chroot)")
	}
	wanted := strings.Split(*only, ",")
	for _, r := range recipes() {
		if !slices.Contains(wanted, r.Name) {
			continue
		}
		start := time.Now()
		res, err := b.build(ctx, r)
		if err != nil {
			return fmt.Errorf("%s: %w", r.Name, err)
		}
		state := "built"
		if res.skipped {
			state = "up to date"
		}
		fmt.Printf("imagebuild: %-6s %s %s %s (%d packages, %.1f MB layer) in %.1fs\n",
			r.Name, state, r.Ref, res.digest, res.packages, float64(res.layerBytes)/1e6, time.Since(start).Seconds())
	}
	return nil
}
