package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/iii-sandbox/iii/compose/packages"
	"github.com/iii-sandbox/iii/internal/selfupdate"
	"github.com/iii-sandbox/iii/internal/version"
)

// codeUnknownUpdateTarget is the usage error of `iii update NAME` for a
// NAME that is not a target.
const codeUnknownUpdateTarget = "UNKNOWN_UPDATE_TARGET"

// updateTarget is a TARGET of `iii update`: the names people type and the
// product each updates.
type updateTarget struct {
	name, product, about string
}

func updateTargets() []updateTarget {
	return []updateTarget{
		{"self", selfupdate.ProductIII, "iii itself, the binary running this command"},
		{"iii", selfupdate.ProductIII, "the same as self"},
		{"iii-cloud", selfupdate.ProductCloud, "the iii-cloud binary in the same directory as iii"},
	}
}

func newUpdateCmd(e env) *cobra.Command {
	var (
		source, want       string
		check, listTargets bool
	)
	cmd := &cobra.Command{
		Use:   "update [TARGET]",
		Short: "Update iii (and iii-cloud beside it) from the release source",
		Long: `iii update installs the latest release of iii over the running binary: it downloads the
archive for this host's target, checks its sha256, and replaces the file atomically. With no
TARGET it also updates iii-cloud when that binary sits beside iii. TARGET self or iii updates
only iii; --list-targets prints the targets.

Releases come from --source (an http(s):// URL, a file:// URL or a directory holding
index.json), else $III_RELEASE_SOURCE, else ` + selfupdate.DefaultSource + `.

iii update never changes worker versions: run 'iii call compose::update' in a project for that.
It lists what iii 0.25 left behind (iii-worker, iii-init, VM state) and deletes none of it.`,
		Example: `  iii update
  iii update self --check
  iii update --version 0.26.0
  iii update --source ./releases`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageErrorf(cmd, "iii update takes at most one TARGET, got %d (%s)", len(args), strings.Join(args, " "))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if listTargets {
				printTargets(e.stdout)
				return nil
			}
			only := ""
			if len(args) == 1 {
				for _, t := range updateTargets() {
					if t.name == args[0] {
						only = t.product
					}
				}
				if only == "" {
					return usageErrorf(cmd, "%s: %q is not an update target; the targets are %s (iii update --list-targets)", codeUnknownUpdateTarget, args[0], targetNames())
				}
			}
			if cmd.Flags().Changed("version") && strings.TrimSpace(want) == "" {
				return usageErrorf(cmd, "--version needs a version, such as 0.26.0")
			}
			src, err := selfupdate.ResolveSource(source, e.getenv)
			if err != nil {
				if source != "" {
					return &usageError{err: err, hint: cmd.CommandPath()}
				}
				return &exitError{code: exitFailure, msg: err.Error()}
			}
			exe, err := selfupdate.Executable()
			if err != nil {
				return &exitError{code: exitFailure, msg: err.Error()}
			}
			if src.Insecure() {
				fmt.Fprintf(e.stderr, "Warning: the release source %s is plain HTTP: what it serves, digests included, can be altered on the way. Use https://.\n", src)
			}
			res, err := selfupdate.Update(cmd.Context(), selfupdate.Options{
				Executable:     exe,
				CurrentVersion: version.Version,
				Source:         src,
				Version:        want,
				Only:           only,
				Check:          check,
				Progress:       packages.Printer(e.stderr, isTerminal(e.stderr)),
				Getenv:         e.getenv,
			})
			if res != nil {
				printUpdate(e.stdout, res)
			}
			if err != nil {
				if cmd.Context().Err() != nil {
					return &exitError{code: exitInterrupted, msg: err.Error()}
				}
				return &exitError{code: exitFailure, msg: err.Error()}
			}
			printPathCheck(e.stderr, res, exe)
			printLeftovers(e.stdout, res)
			fmt.Fprintln(e.stdout, "Workers are not updated here: to update a project's package workers, run 'iii call compose::update'.")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&source, "source", "", "release source: an http(s):// URL, a file:// URL or a directory with index.json (default $"+selfupdate.EnvSource+", else "+selfupdate.DefaultSource+")")
	f.StringVar(&want, "version", "", "install this release instead of the latest (a rollback or a pin)")
	f.BoolVar(&check, "check", false, "only report what would be updated")
	f.BoolVar(&listTargets, "list-targets", false, "print the valid targets and exit")
	return cmd
}

func targetNames() string {
	var names []string
	for _, t := range updateTargets() {
		names = append(names, t.name)
	}
	return strings.Join(names, ", ")
}

func printTargets(w io.Writer) {
	for _, t := range updateTargets() {
		fmt.Fprintf(w, "%-10s %s\n", t.name, t.about)
	}
	fmt.Fprintln(w, "(none)     everything installed: iii, and iii-cloud when it is there")
}

// isTerminal reports a terminal, where the download is one redrawn bar.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && packages.IsTerminal(f)
}

func printUpdate(w io.Writer, res *selfupdate.Result) {
	which := "release " + res.Release
	if res.Latest {
		which = "latest release " + res.Release
	}
	if res.Release != "" {
		origin := ""
		if o := res.Source.Origin(); o != "" {
			origin = " (" + o + ")"
		}
		fmt.Fprintf(w, "Release source %s%s: %s for %s\n", res.Source, origin, which, res.Target)
	}
	for _, p := range res.Products {
		from := p.From
		if from == "" {
			from = "an unknown version"
		}
		switch p.Status {
		case selfupdate.StatusUpdated:
			fmt.Fprintf(w, "%s: updated %s → %s (%s)\n", p.Product, from, p.To, p.Path)
		case selfupdate.StatusUpToDate:
			fmt.Fprintf(w, "%s: %s is up to date (%s)\n", p.Product, p.To, p.Path)
		case selfupdate.StatusAvailable:
			size := ""
			if p.Size > 0 {
				size = fmt.Sprintf(", %s", humanSize(p.Size))
			}
			fmt.Fprintf(w, "%s: %s → %s is available (%s%s); nothing was changed (--check)\n", p.Product, from, p.To, p.Asset, size)
		case selfupdate.StatusNewer:
			fmt.Fprintf(w, "%s: %s is newer than the latest release, %s; nothing was changed ('iii update --version %s' installs that release)\n", p.Product, p.From, p.To, p.To)
		case selfupdate.StatusNotInRelease:
			fmt.Fprintf(w, "%s: release %s has no %s for %s (no %s); left as it is (%s)\n", p.Product, p.To, p.Product, res.Target, p.Asset, p.Path)
		}
	}
}

// printPathCheck warns when the shell does not run the iii that was
// updated, as the upgrade guide describes.
func printPathCheck(w io.Writer, res *selfupdate.Result, exe string) {
	dir := filepath.Dir(exe)
	pc := res.Path
	switch {
	case pc.OnPath == "":
		fmt.Fprintf(w, "Warning: no iii is on your PATH; add %s to it so that 'iii' runs this one.\n", dir)
	case pc.Differs && pc.Homebrew:
		fmt.Fprintf(w, "Warning: your shell runs %s (command -v iii), a Homebrew install, not %s, which iii update manages: 'iii --version' still prints that copy's version, and running 'iii update' from it does not change it. Upgrade it with 'brew upgrade iii', or remove it and put %s first on your PATH.\n",
			pc.OnPath, exe, dir)
	case pc.Differs:
		fmt.Fprintf(w, "Warning: your shell runs %s (command -v iii), not %s, which iii update manages: 'iii --version' still prints that copy's version. Remove that copy, or put %s before %s on your PATH.\n",
			pc.OnPath, exe, dir, filepath.Dir(pc.OnPath))
	}
}

// printLeftovers lists what iii 0.25 left behind, with the command that
// removes the binaries; nothing is deleted.
func printLeftovers(w io.Writer, res *selfupdate.Result) {
	l := res.Leftovers
	if l.Empty() {
		return
	}
	fmt.Fprintln(w, "Left behind by iii 0.25 (nothing was deleted):")
	if len(l.Binaries) > 0 {
		var paths []string
		for _, b := range l.Binaries {
			paths = append(paths, shellQuote(b.Path))
		}
		fmt.Fprintln(w, "  iii-worker and iii-init are not part of iii 0.26. Remove them with:")
		fmt.Fprintf(w, "    rm %s\n", strings.Join(paths, " "))
	}
	if len(l.State) > 0 {
		fmt.Fprintln(w, "  0.25 VM state that iii 0.26 never reads:")
		for _, s := range l.State {
			p := s.Path
			if s.IsDir {
				p += string(filepath.Separator)
			}
			fmt.Fprintf(w, "    %s\n", shellQuote(p))
		}
		fmt.Fprintln(w, "  Delete them as \"Clean up VM state\" in docs/upgrading-to-0.26.md describes;")
		fmt.Fprintln(w, "  keep the rest of ~/.iii/lib/ and ~/.iii/cache/, which sandbox-libkrun still uses.")
	}
}

// shellQuote quotes a path for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:@%,=", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
