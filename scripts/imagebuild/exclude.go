package main

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strings"
)

// An excluded package is kept out of an image's closure by telling apt it
// is already installed: a private dpkg status lists it (the candidate
// version, with what it provides), so apt resolves the roots as it would on
// a system that has it, and pulls in neither it nor whatever only it
// needed. Whatever another package of the closure still depends on stays.

// control is one stanza of Debian control data (apt-cache show), reduced to
// the fields a dpkg status entry needs.
type control struct {
	Package, Version, Arch, MultiArch, Provides string
}

var (
	pkgName    = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]*$`)
	pkgVersion = regexp.MustCompile(`^[A-Za-z0-9.+~:-]+$`)
	pkgArch    = regexp.MustCompile(`^[a-z0-9-]+$`)
	multiArch  = regexp.MustCompile(`^(same|foreign|allowed|no)$`)
	// provides is a comma-separated list of names, each with an optional
	// exact version: "a, b (= 1.0), c".
	provides = regexp.MustCompile(`^[a-z0-9][a-z0-9+.:-]*( \(= [A-Za-z0-9.+~:-]+\))?(, [a-z0-9][a-z0-9+.:-]*( \(= [A-Za-z0-9.+~:-]+\))?)*$`)
)

// parseControl reads the stanzas of Debian control data. Continuation lines
// (a leading space) extend the field before them. A stanza with a field
// outside Debian's character sets is an error, so nothing odd reaches the
// status file apt reads.
func parseControl(data []byte) ([]control, error) {
	var (
		out   []control
		cur   = map[string]string{}
		last  string
		lineN int
	)
	flush := func() error {
		if len(cur) == 0 {
			return nil
		}
		c := control{Package: cur["Package"], Version: cur["Version"], Arch: cur["Architecture"],
			MultiArch: cur["Multi-Arch"], Provides: cur["Provides"]}
		cur, last = map[string]string{}, ""
		switch {
		case !pkgName.MatchString(c.Package):
			return fmt.Errorf("stanza ending at line %d: bad or missing Package %q", lineN, c.Package)
		case !pkgVersion.MatchString(c.Version):
			return fmt.Errorf("%s: bad or missing Version %q", c.Package, c.Version)
		case !pkgArch.MatchString(c.Arch):
			return fmt.Errorf("%s: bad or missing Architecture %q", c.Package, c.Arch)
		case c.MultiArch != "" && !multiArch.MatchString(c.MultiArch):
			return fmt.Errorf("%s: bad Multi-Arch %q", c.Package, c.MultiArch)
		case c.Provides != "" && !provides.MatchString(c.Provides):
			return fmt.Errorf("%s: bad Provides %q", c.Package, c.Provides)
		}
		out = append(out, c)
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lineN++
		line := strings.TrimRight(sc.Text(), "\r")
		switch {
		case strings.TrimSpace(line) == "":
			if err := flush(); err != nil {
				return nil, err
			}
		case line[0] == ' ' || line[0] == '\t':
			if last == "" {
				return nil, fmt.Errorf("line %d: continuation line with no field before it", lineN)
			}
			cur[last] += " " + strings.TrimSpace(line)
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok || k == "" || strings.ContainsAny(k, " \t") {
				return nil, fmt.Errorf("line %d: not a field: %q", lineN, truncate(line, 60))
			}
			last = k
			cur[k] = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read control data: %w", err)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// statusEntry is c as an installed package in a dpkg status file. It lists
// no dependencies: apt has nothing of it left to satisfy.
func statusEntry(c control) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Package: %s\nStatus: install ok installed\nVersion: %s\nArchitecture: %s\n", c.Package, c.Version, c.Arch)
	if c.MultiArch != "" {
		fmt.Fprintf(&b, "Multi-Arch: %s\n", c.MultiArch)
	}
	if c.Provides != "" {
		fmt.Fprintf(&b, "Provides: %s\n", c.Provides)
	}
	b.WriteString("\n")
	return b.String()
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
