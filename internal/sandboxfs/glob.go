package sandboxfs

import (
	"fmt"
	"path"
	"strings"
	"unicode/utf8"
)

// Globs are fs::grep's and fs::sed's include_glob and exclude_glob:
// gitignore-style patterns matched against paths relative to the
// directory being searched.
//
//   - A pattern without a slash (other than a trailing one) matches a
//     name at any depth: "*.go", "testdata".
//   - A pattern with a slash is anchored at the search directory:
//     "src/*.c", "/build" (a leading slash only anchors).
//   - "**" as a whole segment matches any number of directories:
//     "**/gen/*.go", "docs/**".
//   - A trailing slash matches directories only: "vendor/".
//   - A leading "!" re-includes what an earlier pattern excluded; the
//     last pattern that matches a path decides.
//   - Within a segment, "*", "?" and "[...]" work as in path.Match.
//
// A directory that matches applies to everything beneath it.
type Globs struct {
	patterns []globPattern
}

type globPattern struct {
	negate   bool
	dirOnly  bool
	anchored bool
	segs     []string
}

// MaxGlobLen bounds one pattern; real globs are a few dozen bytes, and the
// bound keeps matching cheap whatever a caller sends.
const MaxGlobLen = 1024

// CompileGlobs parses patterns; a malformed one is an error naming it.
// Empty segments are dropped, so "a//b" means "a/b".
func CompileGlobs(patterns []string) (*Globs, error) {
	g := &Globs{}
	for _, raw := range patterns {
		if len(raw) > MaxGlobLen {
			return nil, fmt.Errorf("glob %q… is longer than %d bytes", truncateUTF8(raw, 32), MaxGlobLen)
		}
		p := globPattern{}
		s := raw
		if strings.HasPrefix(s, "!") {
			p.negate = true
			s = s[1:]
		}
		if strings.HasSuffix(s, "/") {
			p.dirOnly = true
			s = strings.TrimRight(s, "/")
		}
		if strings.HasPrefix(s, "/") {
			p.anchored = true
			s = strings.TrimLeft(s, "/")
		}
		if strings.Contains(s, "/") {
			p.anchored = true
		}
		for _, seg := range strings.Split(s, "/") {
			if seg == "" {
				continue
			}
			if seg == "**" && len(p.segs) > 0 && p.segs[len(p.segs)-1] == "**" {
				// Consecutive "**" mean the same as one.
				continue
			}
			if _, err := path.Match(seg, ""); err != nil {
				return nil, fmt.Errorf("glob %q is malformed: %v", raw, err)
			}
			p.segs = append(p.segs, seg)
		}
		if len(p.segs) == 0 {
			return nil, fmt.Errorf("glob %q matches nothing", raw)
		}
		g.patterns = append(g.patterns, p)
	}
	return g, nil
}

// truncateUTF8 cuts s to at most n bytes on a character boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Empty reports whether there are no patterns.
func (g *Globs) Empty() bool { return g == nil || len(g.patterns) == 0 }

// Match reports whether rel (a slash path relative to the search
// directory, without a leading slash) or one of its parent directories is
// matched. isDir says whether rel itself is a directory.
//
// Each pattern is matched against every leading part of rel in one pass,
// so the cost is the patterns' size times the path's, whatever the input.
func (g *Globs) Match(rel string, isDir bool) bool {
	if g.Empty() || rel == "" || rel == "." {
		return false
	}
	segs := strings.Split(rel, "/")
	n := len(segs)
	// state[j] is the verdict of the last pattern that matched the path's
	// first j segments: 1 matched, -1 re-included, 0 none.
	state := make([]int8, n+1)
	for _, p := range g.patterns {
		hits := p.prefixMatches(segs)
		for j := 1; j <= n; j++ {
			if !hits[j] || p.dirOnly && j == n && !isDir {
				continue
			}
			state[j] = 1
			if p.negate {
				state[j] = -1
			}
		}
	}
	for _, v := range state {
		if v == 1 {
			return true
		}
	}
	return false
}

// prefixMatches reports, for each j, whether the pattern matches the
// path's first j segments.
func (p globPattern) prefixMatches(segs []string) []bool {
	hits := make([]bool, len(segs)+1)
	if !p.anchored {
		for j := 1; j <= len(segs); j++ {
			hits[j], _ = path.Match(p.segs[0], segs[j-1])
		}
		return hits
	}
	// cur[j]: the pattern's segments so far match segs[:j].
	cur := make([]bool, len(segs)+1)
	next := make([]bool, len(segs)+1)
	cur[0] = true
	for _, ps := range p.segs {
		if ps == "**" {
			// "**" takes any number of whole segments.
			any := false
			for j := range cur {
				any = any || cur[j]
				next[j] = any
			}
		} else {
			next[0] = false
			for j := 1; j < len(cur); j++ {
				if cur[j-1] {
					next[j], _ = path.Match(ps, segs[j-1])
				} else {
					next[j] = false
				}
			}
		}
		cur, next = next, cur
	}
	copy(hits, cur)
	return hits
}
