package guest

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// GlobSet is a list of gitignore-style patterns, as fs::grep and fs::sed
// take in include_glob and exclude_glob:
//
//   - "*", "?" and "[...]" match within one path segment; "\" escapes.
//   - A pattern without a slash (other than a trailing one) matches at any
//     depth: "*.py" matches "a.py" and "src/lib/a.py".
//   - A pattern with a leading or inner slash is anchored at the search
//     root: "/build" and "src/*.go".
//   - "**" as a whole segment matches zero or more segments.
//   - A trailing slash matches directories only: "node_modules/".
//   - A leading "!" re-includes what an earlier pattern matched; the last
//     pattern that matches a path decides.
//   - A directory that matches also matches everything beneath it.
type GlobSet struct {
	pats []globPattern
}

type globPattern struct {
	negate  bool
	dirOnly bool
	segs    []string
}

// CompileGlobs compiles patterns; an empty list matches nothing.
func CompileGlobs(patterns []string) (*GlobSet, error) {
	gs := &GlobSet{}
	for _, p := range patterns {
		g, err := compileGlob(p)
		if err != nil {
			return nil, fmt.Errorf("glob %q: %w", p, err)
		}
		gs.pats = append(gs.pats, g)
	}
	return gs, nil
}

func compileGlob(p string) (globPattern, error) {
	var g globPattern
	if strings.HasPrefix(p, "!") {
		g.negate = true
		p = p[1:]
	} else if strings.HasPrefix(p, `\!`) || strings.HasPrefix(p, `\#`) {
		p = p[1:]
	}
	for strings.HasSuffix(p, "/") && !strings.HasSuffix(p, `\/`) {
		g.dirOnly = true
		p = p[:len(p)-1]
	}
	if p == "" {
		return g, errors.New("empty pattern")
	}
	anchored := strings.Contains(p, "/")
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return g, errors.New("pattern is only slashes")
	}
	if !anchored {
		g.segs = append(g.segs, "**")
	}
	for _, s := range strings.Split(p, "/") {
		if s == "" {
			continue // "a//b" means "a/b"
		}
		if s == "**" {
			// Consecutive "**" mean the same as one, and collapsing
			// them keeps matching cheap.
			if len(g.segs) > 0 && g.segs[len(g.segs)-1] == "**" {
				continue
			}
		} else if _, err := path.Match(s, ""); err != nil {
			return g, err
		}
		g.segs = append(g.segs, s)
	}
	return g, nil
}

// Empty reports whether the set has no patterns.
func (gs *GlobSet) Empty() bool { return gs == nil || len(gs.pats) == 0 }

// Match reports whether rel (slash-separated, relative to the search root)
// is matched, either itself or through one of its parent directories.
func (gs *GlobSet) Match(rel string, isDir bool) bool {
	if gs.Empty() {
		return false
	}
	segs := splitRel(rel)
	for i := 1; i < len(segs); i++ {
		if gs.matchOne(segs[:i], true) {
			return true
		}
	}
	return gs.matchOne(segs, isDir)
}

func (gs *GlobSet) matchOne(segs []string, isDir bool) bool {
	matched := false
	for _, g := range gs.pats {
		if g.dirOnly && !isDir {
			continue
		}
		if matchSegs(g.segs, segs) {
			matched = !g.negate
		}
	}
	return matched
}

func splitRel(rel string) []string {
	var segs []string
	for _, s := range strings.Split(rel, "/") {
		if s != "" && s != "." {
			segs = append(segs, s)
		}
	}
	return segs
}

// matchSegs matches pattern segments against name segments. It memoises
// (pattern index, name index) pairs, so "**" costs O(len(pat)·len(name)²)
// at worst instead of growing exponentially with the number of "**".
func matchSegs(pat, name []string) bool {
	memo := make(map[[2]int]bool)
	var m func(i, j int) bool
	m = func(i, j int) bool {
		key := [2]int{i, j}
		if v, ok := memo[key]; ok {
			return v
		}
		var res bool
		switch {
		case i == len(pat):
			res = j == len(name)
		case pat[i] == "**":
			for k := j; k <= len(name) && !res; k++ {
				res = m(i+1, k)
			}
		case j == len(name):
			res = false
		default:
			ok, _ := path.Match(pat[i], name[j])
			res = ok && m(i+1, j+1)
		}
		memo[key] = res
		return res
	}
	return m(0, 0)
}
