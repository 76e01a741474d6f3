package config

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// EmptyFile is what a missing config.yaml is created with.
const EmptyFile = "workers: []\n"

// ReadFile reads config.yaml, mapping I/O failures to coded errors.
func ReadFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, errorf(CodeConfigNotFound, "%s does not exist; create it (`workers: []` is enough) or point --config at another file", path)
	case err != nil:
		return nil, errorf(CodeConfigUnreadable, "cannot read %s: %v", path, unwrapPathError(err))
	}
	return data, nil
}

// ParseFile parses the contents of the file at path: messages name path,
// and relative directories resolve against the file's directory.
func ParseFile(path string, data []byte, lookup LookupFunc) (*Config, error) {
	dir := filepath.Dir(path)
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return Parse(data, ParseOptions{Name: path, Dir: dir, Lookup: lookup})
}

// Load reads and parses the file at path.
func Load(path string, lookup LookupFunc) (*Config, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseFile(path, data, lookup)
}

// EnsureOptions say how to handle a missing config.yaml.
type EnsureOptions struct {
	// Interactive is true when a person answers on In: they are asked
	// before the file is created. Otherwise it is created without asking,
	// so scripted and CI starts never hang on a prompt.
	Interactive bool
	In          io.Reader
	Out         io.Writer // where the question is written
}

// EnsureFile creates path with EmptyFile when it is missing (after asking,
// when interactive). It reports whether it created the file. A "no" is a
// CONFIG_NOT_FOUND error.
func EnsureFile(ctx context.Context, path string, o EnsureOptions) (bool, error) {
	_, err := os.Stat(path)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return false, errorf(CodeConfigUnreadable, "cannot read %s: %v", path, unwrapPathError(err))
	}
	if o.Interactive {
		yes, err := ask(ctx, o.In, o.Out, fmt.Sprintf("%s does not exist. Create it with no workers (workers: [])? [y/N] ", path))
		if err != nil {
			return false, err
		}
		if !yes {
			return false, errorf(CodeConfigNotFound, "%s does not exist and was not created; create it (`workers: []` is enough) or point --config at another file", path)
		}
	}
	// O_EXCL: never overwrite a file that appeared since the Stat.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, errorf(CodeConfigUnreadable, "cannot create %s: %v", path, unwrapPathError(err))
	}
	_, werr := f.WriteString(EmptyFile)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		return false, errorf(CodeConfigUnreadable, "cannot write %s: %v", path, errors.Join(werr, cerr))
	}
	return true, nil
}

// ask writes question and reads one line. The read runs in its own
// goroutine so a cancelled ctx (Ctrl-C at the prompt) returns at once; a
// terminal read cannot be interrupted, and the process is exiting anyway.
func ask(ctx context.Context, in io.Reader, out io.Writer, question string) (bool, error) {
	if out != nil {
		fmt.Fprint(out, question)
	}
	if in == nil {
		return false, nil
	}
	answer := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(in).ReadString('\n')
		answer <- line
	}()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case line := <-answer:
		switch strings.ToLower(strings.TrimSpace(line)) {
		case "y", "yes":
			return true, nil
		}
		return false, nil
	}
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
