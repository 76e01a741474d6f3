// Package lazyre holds regular expressions that are compiled on first use.
//
// A package-level regexp.MustCompile runs in every process that links the
// package, whether or not it ever matches anything: the iii binary is the
// engine, the CLI and the compose daemon at once, and its idle engine held
// about 700 KB of compiled name patterns (a bounded repetition such as
// {0,252} compiles to hundreds of instructions) that only Compose or the
// updater use. A lazyre.Regexp costs its pattern string until it is used.
package lazyre

import (
	"regexp"
	"sync"
	"sync/atomic"
)

// Regexp is a regular expression compiled the first time it is used. An
// invalid pattern panics then, as regexp.MustCompile would have at start.
// It is safe for concurrent use.
type Regexp struct {
	pattern string
	mu      sync.Mutex
	re      atomic.Pointer[regexp.Regexp]
}

// New returns a Regexp for pattern without compiling it.
func New(pattern string) *Regexp { return &Regexp{pattern: pattern} }

// Regexp compiles the pattern on the first call and returns it.
func (r *Regexp) Regexp() *regexp.Regexp {
	if re := r.re.Load(); re != nil {
		return re
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if re := r.re.Load(); re != nil {
		return re
	}
	re := regexp.MustCompile(r.pattern)
	r.re.Store(re)
	return re
}

// MatchString reports whether s contains a match of the pattern.
func (r *Regexp) MatchString(s string) bool { return r.Regexp().MatchString(s) }

// FindStringSubmatch is regexp.Regexp.FindStringSubmatch.
func (r *Regexp) FindStringSubmatch(s string) []string { return r.Regexp().FindStringSubmatch(s) }

// String returns the pattern (it does not compile it).
func (r *Regexp) String() string { return r.pattern }

// compiled reports whether the pattern has been compiled.
func (r *Regexp) compiled() bool { return r.re.Load() != nil }
