// Command flood measures a well-behaved worker's call latency on a real
// engine process (bin/iii) during each flood of internal/testkit/flood,
// beside the floor measured in the same run with no flood, and the engine's
// peak RSS against its documented bound.
//
// With -held (the default) it then floods a second engine (with iii-stream)
// with what a caller could make it hold (internal/testkit/flood, held.go),
// as an anonymous worker and with a VM worker's credential; each of those
// phases' peak RSS is its own.
//
//	go run ./scripts/bench/flood [-iii bin/iii] [-held=false]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/internal/testkit/flood"
)

func main() {
	iii := flag.String("iii", "bin/iii", "the iii binary to run (make build)")
	held := flag.Bool("held", true, "also run the floods of what a caller makes the engine hold")
	flag.Parse()
	if err := run(*iii); err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
	if *held {
		if err := runHeld(*iii); err != nil {
			fmt.Fprintln(os.Stderr, "flood (held):", err)
			os.Exit(1)
		}
	}
}

func runHeld(iii string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "iii-bench-flood-held-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := flood.StartWith(ctx, iii, dir, true)
	if err != nil {
		return err
	}
	defer e.Stop()
	vm, err := flood.IssueVMCredential(ctx, e, "proj")
	if err != nil {
		return err
	}
	p, err := flood.StartProber(ctx, e.URL)
	if err != nil {
		return err
	}
	defer p.Close()
	phases, err := flood.RunHeld(ctx, e, p, []flood.Caller{flood.Anonymous, vm}, nil)
	if err != nil {
		return err
	}
	fmt.Printf("what a caller makes the engine hold (each phase's own peak RSS); load average: %s\n", benchstat.LoadAvg())
	printPhases(phases)
	return nil
}

func printPhases(phases []flood.Phase) {
	quiet := phases[0]
	fmt.Printf("  %-40s %8s %12s %12s %10s %9s  %s\n", "phase", "calls", "p50", "p99", "p99/quiet", "peak RSS", "offender got")
	for _, ph := range phases {
		ratio := float64(ph.P99) / float64(max(quiet.P99, 1))
		fmt.Printf("  %-40s %8d %12v %12v %9.1f× %7d MiB  %s\n", ph.Name, ph.Calls, ph.P50, ph.P99, ratio, ph.PeakRSS, ph.Offender)
		if ph.Violation != "" || len(ph.Failures) > 0 {
			fmt.Printf("    VIOLATION: %s %v\n", ph.Violation, ph.Failures)
		}
	}
}

func run(iii string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "iii-bench-flood-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := flood.Start(ctx, iii, dir)
	if err != nil {
		return err
	}
	defer e.Stop()
	p, err := flood.StartProber(ctx, e.URL)
	if err != nil {
		return err
	}
	defer p.Close()
	phases, err := flood.Run(ctx, e, p)
	if err != nil {
		return err
	}
	fmt.Printf("load average: %s\n", benchstat.LoadAvg())
	quiet := phases[0]
	fmt.Printf("  %-24s %8s %12s %12s %10s %9s  %s\n", "phase", "calls", "p50", "p99", "p99/quiet", "peak RSS", "offender got")
	for _, ph := range phases {
		ratio := float64(ph.P99) / float64(max(quiet.P99, 1))
		fmt.Printf("  %-24s %8d %12v %12v %9.1f× %7d MiB  %s\n", ph.Name, ph.Calls, ph.P50, ph.P99, ratio, ph.PeakRSS, ph.Offender)
		if ph.Violation != "" || len(ph.Failures) > 0 {
			fmt.Printf("    VIOLATION: %s %v\n", ph.Violation, ph.Failures)
		}
	}
	rss, err := e.PeakRSSMiB()
	if err != nil {
		return err
	}
	fmt.Printf("  engine peak RSS through the floods: %d MiB (documented bound 512 MiB)\n", rss)
	return nil
}
