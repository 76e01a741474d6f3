package composefile

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/iii-sandbox/iii/compose"
)

// maxEnvFileSize bounds an env file; real ones are a few lines.
const maxEnvFileSize = 1 << 20

// ReadEnvFile reads an env_file: one KEY=value per line, with an optional
// `export ` prefix, blank lines and # comments ignored, and values either
// bare (trimmed; " #" starts a comment), 'single-quoted' (literal) or
// "double-quoted" (with \n \r \t \" \\ \$ escapes). Values are not
// interpolated. A later line wins over an earlier one for the same key.
// Errors: MISSING_ENV_FILE (absent, or a directory), IO_ERROR,
// INVALID_COMPOSE_FILE (a malformed line, with its number), and
// RESERVED_ENV_OVERRIDE (a variable Compose sets itself).
func ReadEnvFile(path string) (map[string]string, error) {
	if err := statEnvFile(path); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("cannot read env file %s: %v", path, unwrapPath(err)))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxEnvFileSize+1))
	if err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("cannot read env file %s: %v", path, unwrapPath(err)))
	}
	if len(data) > maxEnvFileSize {
		return nil, compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("env file %s is larger than %d KiB; it should hold KEY=value lines only", path, maxEnvFileSize>>10))
	}
	return ParseEnvFile(data, path)
}

// ParseEnvFile parses env file contents; name is how messages refer to it.
func ParseEnvFile(data []byte, name string) (map[string]string, error) {
	out := map[string]string{}
	text := strings.TrimPrefix(string(data), "\uFEFF")
	for i, line := range strings.Split(text, "\n") {
		lineNo := i + 1
		bad := func(format string, args ...any) error {
			return compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("%s:%d: %s", name, lineNo, fmt.Sprintf(format, args...)))
		}
		line = strings.TrimSuffix(line, "\r")
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if rest, ok := strings.CutPrefix(t, "export"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			t = strings.TrimSpace(rest)
		}
		key, raw, ok := strings.Cut(t, "=")
		if !ok {
			return nil, bad("%q is not KEY=value; write KEY=value, or start the line with # for a comment", clip(t, 60))
		}
		key = strings.TrimSpace(key)
		if !envNameRE.MatchString(key) {
			return nil, bad("%q is not a variable name; use letters, digits and _, not starting with a digit", clip(key, 60))
		}
		if IsReservedEnv(key) {
			return nil, compose.New(compose.CodeReservedEnvOverride, fmt.Sprintf("%s:%d: sets %s, which Compose sets itself for every worker; remove the line (reserved: %s)",
				name, lineNo, key, strings.Join(reservedEnv, ", ")))
		}
		value, err := envValue(strings.TrimLeft(raw, " \t"))
		if err != "" {
			return nil, bad("%s: %s", key, err)
		}
		if strings.ContainsRune(value, 0) {
			return nil, bad("%s: the value holds a NUL byte, which no environment variable can carry", key)
		}
		out[key] = value
	}
	return out, nil
}

// envValue decodes the text after "=". It returns a reason when the text is
// malformed.
func envValue(raw string) (string, string) {
	if raw == "" {
		return "", ""
	}
	switch raw[0] {
	case '\'':
		end := strings.IndexByte(raw[1:], '\'')
		if end < 0 {
			return "", "the single quote is never closed; close it on the same line"
		}
		if why := trailing(raw[end+2:]); why != "" {
			return "", why
		}
		return raw[1 : end+1], ""
	case '"':
		var b strings.Builder
		for i := 1; i < len(raw); i++ {
			c := raw[i]
			switch c {
			case '"':
				if why := trailing(raw[i+1:]); why != "" {
					return "", why
				}
				return b.String(), ""
			case '\\':
				if i+1 >= len(raw) {
					return "", "the double quote is never closed; close it on the same line"
				}
				i++
				switch raw[i] {
				case 'n':
					b.WriteByte('\n')
				case 'r':
					b.WriteByte('\r')
				case 't':
					b.WriteByte('\t')
				case '"', '\\', '$':
					b.WriteByte(raw[i])
				default:
					// An unknown escape stays as written, as in a shell.
					b.WriteByte('\\')
					b.WriteByte(raw[i])
				}
			default:
				b.WriteByte(c)
			}
		}
		return "", "the double quote is never closed; close it on the same line"
	}
	v := raw
	for i := 1; i < len(v); i++ {
		if v[i] == '#' && (v[i-1] == ' ' || v[i-1] == '\t') {
			v = v[:i]
			break
		}
	}
	return strings.TrimSpace(v), ""
}

// trailing accepts only blanks and a comment after a closing quote.
func trailing(s string) string {
	t := strings.TrimLeft(s, " \t")
	if t == "" || (strings.HasPrefix(t, "#") && len(t) < len(s)) {
		return ""
	}
	return fmt.Sprintf("unexpected %q after the closing quote; quote the whole value", clip(t, 30))
}
