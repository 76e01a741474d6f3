package fsops

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/textscan"
)

// osCreateExcl creates a new file, failing if it exists.
const osCreateExcl = os.O_WRONLY | os.O_CREATE | os.O_EXCL

func itoa(i int) string { return strconv.Itoa(i) }

// compilePattern compiles a grep or sed pattern: RE2, or a literal string
// when literal is set.
func compilePattern(pattern string, literal, ignoreCase bool) (*regexp.Regexp, error) {
	p := pattern
	if literal {
		p = regexp.QuoteMeta(p)
	}
	if ignoreCase {
		p = "(?i)" + p
	}
	re, err := regexp.Compile(p)
	if err != nil {
		return nil, contract.NewError(contract.S217, "pattern %q is not a valid RE2 regular expression: %v", truncate(pattern, 120), err)
	}
	return re, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// walkFiles calls visit for each regular file under the root-relative
// directory name that the globs admit, in lexical order: all of the tree
// with recursive, else only the directory's own files. Symbolic links are
// not followed. rel is the file's path relative to name.
func (t *Tree) walkFiles(ctx context.Context, name string, recursive bool, include, exclude *Globs,
	visit func(file, rel string) error,
) error {
	return fs.WalkDir(t.root.FS(), name, func(p string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if p == name {
			if err != nil {
				return Error(t.display(p), err)
			}
			return nil
		}
		if err != nil {
			// An unreadable corner of the tree is skipped, as grep -r
			// skips it with a warning.
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		rel := strings.TrimPrefix(p, name+"/")
		if name == "." {
			rel = p
		}
		if d.IsDir() {
			if !recursive || exclude.Match(rel, true) {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if exclude.Match(rel, false) {
			return nil
		}
		if !include.Empty() && !include.Match(rel, false) {
			return nil
		}
		return visit(p, rel)
	})
}

// readLine returns the next line without its line ending, keeping at most
// textscan.MaxLine bytes of it. ok is false at the end of the input.
func readLine(br *bufio.Reader, buf []byte) (line []byte, ok bool, err error) {
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

// Grep serves fs::grep: every line matching the RE2 pattern in the file,
// or in the directory's files (recursively unless recursive is false),
// skipping binary files and symbolic links, filtered by the globs. It
// stops at max_matches and then reports truncated.
func (t *Tree) Grep(ctx context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	re, err := compilePattern(req.Pattern, false, req.IgnoreCase)
	if err != nil {
		return nil, err
	}
	include, err := CompileGlobs(req.IncludeGlob)
	if err != nil {
		return nil, contract.NewError(contract.S210, "invalid sandbox::fs::grep request: include_glob: %v", err)
	}
	exclude, err := CompileGlobs(req.ExcludeGlob)
	if err != nil {
		return nil, contract.NewError(contract.S210, "invalid sandbox::fs::grep request: exclude_glob: %v", err)
	}
	name, display := t.Resolve(req.Path)
	st, err := t.root.Stat(name)
	if err != nil {
		return nil, Error(display, err)
	}
	maxMatches := req.MaxMatches
	if maxMatches == 0 {
		maxMatches = contract.DefaultGrepMaxMatches
	}
	maxLine := req.MaxLineBytes
	if maxLine == 0 {
		maxLine = contract.DefaultGrepMaxLineBytes
	}
	out := &contract.FsGrepResponse{}
	errFull := errors.New("max_matches reached")
	buf := make([]byte, 0, 4096)
	search := func(file string) error {
		f, err := t.root.Open(file)
		if err != nil {
			// Gone or unreadable since the walk saw it.
			return nil
		}
		defer f.Close()
		br := bufio.NewReaderSize(f, 64<<10)
		if head, _ := br.Peek(textscan.BinarySniff); textscan.IsBinary(head) {
			return nil
		}
		shown := t.display(file)
		for n := uint64(1); ; n++ {
			if n%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			var line []byte
			var ok bool
			line, ok, err = readLine(br, buf)
			if err != nil || !ok {
				return nil
			}
			buf = line[:0]
			if !re.Match(line) {
				continue
			}
			if uint64(len(out.Matches)) == maxMatches {
				out.Truncated = true
				return errFull
			}
			out.Matches = append(out.Matches, contract.GrepMatch{Path: shown, Line: n, Content: textscan.CutLine(line, int(min(maxLine, math.MaxInt)))})
		}
	}
	switch {
	case st.Mode().IsRegular():
		err = search(name)
	case !st.IsDir():
		return nil, contract.NewError(contract.S212, "not a regular file or directory: %s", display)
	default:
		err = t.walkFiles(ctx, name, req.Recursive, include, exclude, func(file, _ string) error { return search(file) })
	}
	if err != nil && !errors.Is(err, errFull) {
		return nil, err
	}
	return out, nil
}

// Sed serves fs::sed: replace pattern (RE2 with $1-style group references
// in the replacement, or a literal string when regex is false) line by
// line, so ^ and $ anchor at line ends and a match never spans lines. With
// first_only only each file's first match is replaced. Files listed in
// files are each reported; walking path reports only the files it
// changed or could not change, skipping binary files. A file is rewritten
// atomically (a temporary file renamed over it) and keeps its mode.
func (t *Tree) Sed(ctx context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	re, err := compilePattern(req.Pattern, !req.Regex, req.IgnoreCase)
	if err != nil {
		return nil, err
	}
	out := &contract.FsSedResponse{}
	add := func(r contract.SedResult) {
		out.Results = append(out.Results, r)
		out.TotalReplacements += r.Replacements
	}
	if len(req.Files) > 0 {
		for _, p := range req.Files {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			name, display := t.Resolve(p)
			add(t.sedFile(name, display, re, req))
		}
		return out, nil
	}
	include, err := CompileGlobs(req.IncludeGlob)
	if err != nil {
		return nil, contract.NewError(contract.S210, "invalid sandbox::fs::sed request: include_glob: %v", err)
	}
	exclude, err := CompileGlobs(req.ExcludeGlob)
	if err != nil {
		return nil, contract.NewError(contract.S210, "invalid sandbox::fs::sed request: exclude_glob: %v", err)
	}
	name, display := t.Resolve(req.Path)
	st, err := t.root.Stat(name)
	if err != nil {
		return nil, Error(display, err)
	}
	if !st.IsDir() {
		add(t.sedFile(name, display, re, req))
		return out, nil
	}
	err = t.walkFiles(ctx, name, req.Recursive, include, exclude, func(file, _ string) error {
		if binary, err := t.binaryFile(file); err == nil && binary {
			return nil
		}
		r := t.sedFile(file, t.display(file), re, req)
		if r.Replacements > 0 || !r.Success {
			add(r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (t *Tree) binaryFile(name string) (bool, error) {
	f, err := t.root.Open(name)
	if err != nil {
		return false, err
	}
	defer f.Close()
	head := make([]byte, textscan.BinarySniff)
	n, _ := io.ReadFull(f, head)
	return textscan.IsBinary(head[:n]), nil
}

// sedFile rewrites one file; failures are reported in the result, not as
// an error, so one bad file does not hide what happened to the others.
func (t *Tree) sedFile(name, display string, re *regexp.Regexp, req *contract.FsSedRequest) contract.SedResult {
	res := contract.SedResult{Path: display}
	fail := func(err error) contract.SedResult {
		res.Success = false
		res.Replacements = 0
		var se *contract.Error
		if errors.As(err, &se) {
			res.Error = string(se.Code) + ": " + se.Message
		} else {
			res.Error = err.Error()
		}
		return res
	}
	st, err := t.root.Stat(name)
	if err != nil {
		return fail(Error(display, err))
	}
	if !st.Mode().IsRegular() {
		return fail(contract.NewError(contract.S212, "not a regular file: %s", display))
	}
	if st.Size() > textscan.MaxSedFile {
		return fail(contract.NewError(contract.S216, "%s is larger than sed's %d MiB limit", display, textscan.MaxSedFile>>20))
	}
	data, err := t.root.ReadFile(name)
	if err != nil {
		return fail(Error(display, err))
	}
	replaced, n := replaceLines(data, re, []byte(req.Replacement), req.Regex, req.FirstOnly)
	res.Success = true
	res.Replacements = n
	if n == 0 {
		return res
	}
	if err := t.replaceFile(name, display, replaced, st.Mode()); err != nil {
		return fail(err)
	}
	return res
}

// replaceLines applies re to each line of data (without its line ending)
// and returns the new contents and the number of replacements. In regex
// mode the replacement expands $1 and ${name}; otherwise it is literal.
func replaceLines(data []byte, re *regexp.Regexp, repl []byte, expand, firstOnly bool) ([]byte, uint64) {
	var out bytes.Buffer
	out.Grow(len(data))
	var count uint64
	for len(data) > 0 {
		end := bytes.IndexByte(data, '\n')
		var line, eol []byte
		if end < 0 {
			line, data = data, nil
		} else {
			line, eol, data = data[:end], data[end:end+1], data[end+1:]
		}
		if cr := len(line) - 1; cr >= 0 && line[cr] == '\r' {
			line, eol = line[:cr], append([]byte("\r"), eol...)
		}
		if firstOnly && count > 0 {
			out.Write(line)
			out.Write(eol)
			continue
		}
		locs := re.FindAllSubmatchIndex(line, -1)
		if firstOnly && len(locs) > 1 {
			locs = locs[:1]
		}
		last := 0
		for _, loc := range locs {
			out.Write(line[last:loc[0]])
			if expand {
				out.Write(re.Expand(nil, repl, line, loc))
			} else {
				out.Write(repl)
			}
			last = loc[1]
			count++
		}
		out.Write(line[last:])
		out.Write(eol)
	}
	return out.Bytes(), count
}

// replaceFile writes data over name atomically: a temporary file beside
// it, given name's mode, renamed over it.
func (t *Tree) replaceFile(name, display string, data []byte, mode fs.FileMode) error {
	dir, base := path.Split(name)
	var tmp string
	for i := 0; ; i++ {
		tmp = path.Join(dir, "."+base+".sed-"+itoa(i))
		f, err := t.root.OpenFile(tmp, osCreateExcl, 0o600)
		if errors.Is(err, fs.ErrExist) && i < 100 {
			continue
		}
		if err != nil {
			return Error(display, err)
		}
		_, werr := f.Write(data)
		cerr := f.Close()
		if werr == nil {
			werr = cerr
		}
		if werr == nil {
			werr = t.root.Chmod(tmp, mode)
		}
		if werr == nil {
			werr = t.root.Rename(tmp, name)
		}
		if werr != nil {
			_ = t.root.Remove(tmp)
			return Error(display, werr)
		}
		return nil
	}
}
