package fsops

import "github.com/iii-sandbox/iii/internal/sandboxfs"

// Globs are fs::grep's and fs::sed's include_glob and exclude_glob:
// gitignore-style patterns matched against paths relative to the
// directory being searched.
//
//   - A pattern without a slash (other than a trailing one) matches a
//     name at any depth: "*.go", "testdata".
//   - A pattern with a slash is anchored at the search directory:
//     "src/*.c", "/build" (a leading slash only anchors); "a//b" is "a/b".
//   - "**" as a whole segment matches any number of directories:
//     "**/gen/*.go", "docs/**".
//   - A trailing slash matches directories only: "vendor/".
//   - A leading "!" re-includes what an earlier pattern excluded; the
//     last pattern that matches a path decides.
//   - Within a segment, "*", "?" and "[...]" work as in path.Match.
//   - A pattern longer than 1024 bytes is refused.
//
// A directory that matches applies to everything beneath it.
type Globs = sandboxfs.Globs

// CompileGlobs parses patterns; a malformed one is an error naming it.
func CompileGlobs(patterns []string) (*Globs, error) { return sandboxfs.CompileGlobs(patterns) }
