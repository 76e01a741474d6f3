// Command imagepull measures how fast the image store pulls and unpacks the
// python preset from a registry (the in-process one, over real HTTP on
// loopback), next to the floor: `tar -x` of the same layer blobs from local
// disk. It prints both, and their ratio, for the median of -runs runs.
//
// Run scripts/build-images.sh first; then: go run ./scripts/bench/imagepull
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/registrytest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "imagepull:", err)
		os.Exit(1)
	}
}

type sample struct {
	pullUnpack, build, total time.Duration
}

func run() error {
	root, err := images.DefaultRoot()
	if err != nil {
		return err
	}
	var (
		layout = flag.String("layout", filepath.Join(root, "oci"), "local OCI layout holding the image")
		ref    = flag.String("ref", "docker.io/iiidev/python:latest", "image to pull")
		runs   = flag.Int("runs", 3, "runs of each measurement (the median is printed)")
	)
	flag.Parse()
	ctx := context.Background()

	entry, err := ocilayout.Find(*layout, *ref)
	if err != nil {
		return err
	}
	if entry == nil || entry.Image == nil {
		return fmt.Errorf("%s is not in %s: run scripts/build-images.sh first", *ref, *layout)
	}
	m, err := entry.Image.Manifest()
	if err != nil {
		return err
	}
	var compressed int64
	for _, l := range m.Layers {
		compressed += l.Size
	}

	reg, err := registrytest.Start(registrytest.Options{})
	if err != nil {
		return err
	}
	defer reg.Close()
	if _, err := reg.PushLayout(ctx, *layout, *ref); err != nil {
		return err
	}

	scratch, err := os.MkdirTemp("", "imagepull-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)

	var store, floor []sample
	var unpacked int64
	for i := range *runs {
		s, n, err := pullOnce(ctx, filepath.Join(scratch, fmt.Sprintf("store-%d", i)), reg.URL(), *ref)
		if err != nil {
			return err
		}
		unpacked = n
		store = append(store, s)
		f, err := tarOnce(ctx, filepath.Join(scratch, fmt.Sprintf("tar-%d", i)), *layout, m.Layers)
		if err != nil {
			return err
		}
		floor = append(floor, f)
	}
	sm, fm := median(store), median(floor)
	mb := func(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }
	fmt.Printf("image %s: %d layer(s), %.1f MB compressed, %.1f MB unpacked; median of %d runs\n",
		*ref, len(m.Layers), float64(compressed)/1e6, float64(unpacked)/1e6, *runs)
	fmt.Printf("  store pull+unpack (registry over loopback HTTP, verify, extract): %7.0f ms  %6.1f MB/s unpacked\n",
		ms(sm.pullUnpack), mb(unpacked, sm.pullUnpack))
	fmt.Printf("  floor tar -x of the same blobs from local disk:                  %7.0f ms  %6.1f MB/s unpacked\n",
		ms(fm.pullUnpack), mb(unpacked, fm.pullUnpack))
	fmt.Printf("  ratio store/floor: %.2fx\n", sm.pullUnpack.Seconds()/fm.pullUnpack.Seconds())
	fmt.Printf("  erofs build: %.0f ms; whole Ensure: %.0f ms\n", ms(sm.build), ms(sm.total))
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(s []sample) sample {
	sort.Slice(s, func(i, j int) bool { return s[i].pullUnpack < s[j].pullUnpack })
	return s[len(s)/2]
}

// pullOnce installs ref into a fresh store whose docker.io is the test
// registry, timing the phases from the store's own progress reports.
func pullOnce(ctx context.Context, root, mirror, ref string) (sample, int64, error) {
	st, err := images.Open(images.Options{Root: root, LocalLayouts: []string{}, Mirrors: map[string]string{"docker.io": mirror}})
	if err != nil {
		return sample{}, 0, err
	}
	defer st.Close()
	var mu sync.Mutex
	var buildStart time.Time
	start := time.Now()
	img, err := st.Ensure(ctx, ref, images.EnsureOptions{AutoInstall: true, Progress: func(p images.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if p.Phase == images.PhaseBuilding && buildStart.IsZero() {
			buildStart = time.Now()
		}
	}})
	if err != nil {
		return sample{}, 0, err
	}
	end := time.Now()
	mu.Lock()
	defer mu.Unlock()
	return sample{pullUnpack: buildStart.Sub(start), build: end.Sub(buildStart), total: end.Sub(start)}, img.Config.Unpacked.Bytes, nil
}

func tarOnce(ctx context.Context, dir, layout string, layers []v1.Descriptor) (sample, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return sample{}, err
	}
	start := time.Now()
	for _, l := range layers {
		out, err := exec.CommandContext(ctx, "tar", "-xzf", ocilayout.BlobPath(layout, l.Digest), "-C", dir).CombinedOutput()
		if err != nil {
			return sample{}, fmt.Errorf("tar -x: %v: %s", err, out)
		}
	}
	d := time.Since(start)
	return sample{pullUnpack: d, total: d}, nil
}
