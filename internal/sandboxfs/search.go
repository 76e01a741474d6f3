package sandboxfs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"regexp"
	"sort"

	"github.com/iii-sandbox/iii/internal/textscan"
)

// Defaults for a grep that does not say.
const (
	DefaultMaxMatches   = 10_000
	DefaultMaxLineBytes = 4096
)

// compilePattern compiles a grep or sed pattern: RE2, or a literal string
// when literal is set.
func compilePattern(op, pattern string, literal, ignoreCase bool) (*regexp.Regexp, error) {
	if pattern == "" {
		return nil, invalid(op, "pattern is required")
	}
	p := pattern
	if literal {
		p = regexp.QuoteMeta(p)
	}
	if ignoreCase {
		p = "(?i)" + p
	}
	re, err := regexp.Compile(p)
	if err != nil {
		return nil, errorf(KindRegex, "pattern %q is not a valid RE2 regular expression: %v", truncateUTF8(pattern, 120), err)
	}
	return re, nil
}

func compileGlobPair(op string, inc, exc []string) (include, exclude *Globs, err error) {
	if include, err = CompileGlobs(inc); err != nil {
		return nil, nil, invalid(op, "include_glob: %v", err)
	}
	if exclude, err = CompileGlobs(exc); err != nil {
		return nil, nil, invalid(op, "exclude_glob: %v", err)
	}
	return include, exclude, nil
}

// walkFiles calls visit for each regular file under the directory name
// that the globs admit, in lexical order: the whole tree with recursive,
// else the directory's own files. Symbolic links are not followed.
func (t *Tree) walkFiles(ctx context.Context, name string, recursive bool, include, exclude *Globs,
	visit func(file string) (stop bool),
) error {
	prefix := name + "/"
	if name == "." {
		prefix = ""
	}
	errStop := errors.New("stop")
	err := t.walk(ctx, name, func(n string, d fs.DirEntry) (bool, error) {
		rel := n[len(prefix):]
		if d.IsDir() {
			return !recursive || exclude.Match(rel, true), nil
		}
		if !d.Type().IsRegular() {
			return false, nil // symbolic links, devices, FIFOs
		}
		if exclude.Match(rel, false) || (!include.Empty() && !include.Match(rel, false)) {
			return false, nil
		}
		if visit(n) {
			return false, errStop
		}
		return false, nil
	})
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

// ReadLine returns the next line of br without its line ending ("\n", and
// a "\r" before it or at the end of the input), keeping at most
// textscan.MaxLine bytes of it; the rest of a longer line is skipped. ok is
// false at the end of the input. buf is reused for the line.
func ReadLine(br *bufio.Reader, buf []byte) (line []byte, ok bool, err error) {
	buf = buf[:0]
	for {
		chunk, err := br.ReadSlice('\n')
		if room := textscan.MaxLine - len(buf); room > 0 {
			buf = append(buf, chunk[:min(len(chunk), room)]...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(chunk) == 0 && len(buf) == 0 {
				return nil, false, nil
			}
			return trimEOL(buf), true, nil
		case err != nil:
			return nil, false, err
		}
		return trimEOL(buf), true, nil
	}
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// GrepRequest is what grep searches for.
type GrepRequest struct {
	Path         string
	Pattern      string
	IgnoreCase   bool
	Recursive    bool
	IncludeGlob  []string
	ExcludeGlob  []string
	MaxMatches   uint64 // 0: DefaultMaxMatches
	MaxLineBytes uint64 // 0: DefaultMaxLineBytes
}

// GrepMatch is one matching line.
type GrepMatch struct {
	Path    string
	Line    uint64
	Content string
}

// Grep finds every line matching the RE2 pattern in the file, or in the
// directory's files (all levels with recursive), skipping binary files and
// symbolic links, filtered by the globs. It stops at MaxMatches and then
// reports truncated.
func (t *Tree) Grep(ctx context.Context, req *GrepRequest) (matches []GrepMatch, truncated bool, err error) {
	name, display, err := t.resolve("grep", "path", req.Path)
	if err != nil {
		return nil, false, err
	}
	re, err := compilePattern("grep", req.Pattern, false, req.IgnoreCase)
	if err != nil {
		return nil, false, err
	}
	include, exclude, err := compileGlobPair("grep", req.IncludeGlob, req.ExcludeGlob)
	if err != nil {
		return nil, false, err
	}
	st, err := t.fsys.Stat(name)
	if err != nil {
		return nil, false, FromOS(display, err)
	}
	maxMatches := req.MaxMatches
	if maxMatches == 0 {
		maxMatches = DefaultMaxMatches
	}
	maxLine := req.MaxLineBytes
	if maxLine == 0 {
		maxLine = DefaultMaxLineBytes
	}
	maxLine = min(maxLine, textscan.MaxLine)
	matches = []GrepMatch{}
	buf := make([]byte, 0, 4096)
	var ctxErr error
	// search reports whether the search should stop.
	search := func(file string) bool {
		f, err := t.fsys.Open(file)
		if err != nil {
			return false // gone or unreadable since the walk saw it
		}
		defer f.Close()
		br := bufio.NewReaderSize(f, 64<<10)
		if head, _ := br.Peek(textscan.BinarySniff); textscan.IsBinary(head) {
			return false
		}
		shown := show(file)
		for n := uint64(1); ; n++ {
			if n%4096 == 0 {
				if ctxErr = ctx.Err(); ctxErr != nil {
					return true
				}
			}
			line, ok, err := ReadLine(br, buf)
			if err != nil || !ok {
				return false
			}
			buf = line[:0]
			if !re.Match(line) {
				continue
			}
			if uint64(len(matches)) == maxMatches {
				truncated = true
				return true
			}
			matches = append(matches, GrepMatch{Path: shown, Line: n, Content: textscan.CutLine(line, int(maxLine))})
		}
	}
	switch {
	case st.Mode().IsRegular():
		search(name)
	case !st.IsDir():
		return nil, false, errorf(KindWrongType, "not a regular file or directory: %s", display)
	default:
		err = t.walkFiles(ctx, name, req.Recursive, include, exclude, search)
	}
	if err == nil {
		err = ctxErr
	}
	if err != nil {
		return nil, false, err
	}
	return matches, truncated, nil
}

// SedRequest is what sed replaces, and where.
type SedRequest struct {
	Files       []string // exactly one of Files and Path
	Path        string
	Recursive   bool
	IncludeGlob []string
	ExcludeGlob []string
	Pattern     string
	Replacement string
	Regex       bool // false: Pattern and Replacement are literal
	FirstOnly   bool
	IgnoreCase  bool
}

// SedResult is the outcome for one file; Err is set when it failed.
type SedResult struct {
	Path         string
	Replacements uint64
	Err          *Error
}

// Sed replaces pattern (RE2 with $1-style references in the replacement,
// or a literal string when Regex is false) over each file's whole content:
// "^" and "$" anchor at the start and end of the file unless the pattern
// turns on (?m), and a match may span lines. With FirstOnly only each
// file's first match is replaced.
//
// Each file named in Files is reported, in the order given. Over Path
// (a directory walked with the globs, or a single file) binary files are
// skipped and only the files changed or failed are reported, sorted by
// path. A changed file is rewritten atomically (a temporary file beside
// it, synced, renamed over it) and keeps its mode and, where the caller may
// set it, its owner; an unchanged file is not rewritten. A file that fails
// is reported in its result and does not stop the others.
func (t *Tree) Sed(ctx context.Context, req *SedRequest) (results []SedResult, total uint64, err error) {
	if (len(req.Files) > 0) == (req.Path != "") {
		return nil, 0, invalid("sed", "give exactly one of files and path")
	}
	re, err := compilePattern("sed", req.Pattern, !req.Regex, req.IgnoreCase)
	if err != nil {
		return nil, 0, err
	}
	results = []SedResult{}
	add := func(r SedResult) {
		results = append(results, r)
		total += r.Replacements
	}
	if len(req.Files) > 0 {
		for _, p := range req.Files {
			if err := ctx.Err(); err != nil {
				return nil, 0, err
			}
			name, display, err := t.resolve("sed", "files[]", p)
			if err != nil {
				return nil, 0, err
			}
			add(t.sedFile(name, display, re, req, false))
		}
		return results, total, nil
	}
	name, display, err := t.resolve("sed", "path", req.Path)
	if err != nil {
		return nil, 0, err
	}
	include, exclude, err := compileGlobPair("sed", req.IncludeGlob, req.ExcludeGlob)
	if err != nil {
		return nil, 0, err
	}
	st, err := t.fsys.Stat(name)
	if err != nil {
		return nil, 0, FromOS(display, err)
	}
	one := func(file string) bool {
		if r := t.sedFile(file, show(file), re, req, true); r.Replacements > 0 || r.Err != nil {
			add(r)
		}
		return false
	}
	if !st.IsDir() {
		one(name)
		return results, total, nil
	}
	if err := t.walkFiles(ctx, name, req.Recursive, include, exclude, one); err != nil {
		return nil, 0, err
	}
	sort.SliceStable(results, func(i, j int) bool { return results[i].Path < results[j].Path })
	return results, total, nil
}

// sedFile rewrites one file. A binary file is left alone (no replacements,
// no error) when skipBinary is set.
func (t *Tree) sedFile(name, display string, re *regexp.Regexp, req *SedRequest, skipBinary bool) SedResult {
	res := SedResult{Path: display}
	fail := func(err error) SedResult {
		var se *Error
		if !errors.As(FromOS(display, err), &se) {
			se = errorf(KindIO, "%s: %v", display, err)
		}
		res.Err = se
		res.Replacements = 0
		return res
	}
	st, err := t.fsys.Stat(name)
	if err != nil {
		return fail(err)
	}
	if !st.Mode().IsRegular() {
		return fail(errorf(KindWrongType, "not a regular file: %s", display))
	}
	if st.Size() > textscan.MaxSedFile {
		return fail(errorf(KindIO, "%s is larger than sed's %d MiB limit", display, textscan.MaxSedFile>>20))
	}
	data, err := t.readFile(name)
	if err != nil {
		return fail(err)
	}
	if skipBinary && textscan.IsBinary(data[:min(len(data), textscan.BinarySniff)]) {
		return res
	}
	out, n := Replace(data, re, []byte(req.Replacement), req.Regex, req.FirstOnly)
	if n == 0 {
		return res
	}
	if err := t.replaceFile(name, out, st); err != nil {
		return fail(err)
	}
	res.Replacements = n
	return res
}

func (t *Tree) readFile(name string) ([]byte, error) {
	f, err := t.fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// One byte past the limit tells a file that grew since the stat.
	data, err := io.ReadAll(io.LimitReader(f, textscan.MaxSedFile+1))
	if err == nil && len(data) > textscan.MaxSedFile {
		err = errorf(KindIO, "%s is larger than sed's %d MiB limit", show(name), textscan.MaxSedFile>>20)
	}
	return data, err
}

// Replace applies re to the whole of data and returns the new content and
// the number of replacements. With expand the replacement expands $1 and
// ${name}; otherwise it is literal. firstOnly stops after one.
func Replace(data []byte, re *regexp.Regexp, repl []byte, expand, firstOnly bool) ([]byte, uint64) {
	limit := -1
	if firstOnly {
		limit = 1
	}
	locs := re.FindAllSubmatchIndex(data, limit)
	if len(locs) == 0 {
		return data, 0
	}
	out := make([]byte, 0, len(data))
	last := 0
	for _, loc := range locs {
		out = append(out, data[last:loc[0]]...)
		if expand {
			out = re.Expand(out, repl, data, loc)
		} else {
			out = append(out, repl...)
		}
		last = loc[1]
	}
	out = append(out, data[last:]...)
	return out, uint64(len(locs))
}

// replaceFile writes data over name atomically: a temporary file beside
// it, synced, given name's owner (where allowed) and mode, renamed over it.
func (t *Tree) replaceFile(name string, data []byte, st fs.FileInfo) error {
	tmp, f, err := t.createTemp(name, "sed")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		if uid, gid, ok := owner(st); ok {
			// Best effort: only root may give a file away, and a file
			// that keeps its mode but not its owner is still right for
			// everyone else.
			_ = t.fsys.Lchown(tmp, uid, gid)
		}
		// After the chown, which clears setuid and setgid.
		werr = t.fsys.Chmod(tmp, st.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
	}
	if werr == nil {
		werr = t.fsys.Rename(tmp, name)
	}
	if werr != nil {
		_ = t.fsys.Remove(tmp)
		return werr
	}
	return nil
}
