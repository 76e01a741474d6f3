// Package envexpand expands the engine's ${NAME} and ${NAME:default}
// placeholders. config.yaml, the configuration worker, Compose (which reads
// the managed engine's port as the engine will) and workerkit (worker config
// values) all expand the same syntax, so it lives here rather than in
// host/config, which compose/ and workers/ may not import
// (docs/architecture.md, "Layers").
package envexpand

import "strings"

// LookupFunc reads one environment variable; os.LookupEnv fits. Passing it
// in keeps parsing free of process state, so tests and the fuzzer control
// the environment.
type LookupFunc func(name string) (string, bool)

// Placeholder is one ${NAME} or ${NAME:default} found in a string.
type Placeholder struct {
	Name       string
	Default    string
	HasDefault bool
	Start, End int // byte offsets of "${" and one past "}"
}

// Placeholders lists the placeholders of s in order. The engine syntax has a
// single colon: in ${PORT:-3111} the default is "-3111", unlike the Compose
// syntax. A "${" that does not start a well-formed placeholder (bad name, no
// closing brace) is plain text.
func Placeholders(s string) []Placeholder {
	var out []Placeholder
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], "${")
		if j < 0 {
			break
		}
		start := i + j
		p, ok := parsePlaceholder(s, start)
		if !ok {
			i = start + 2
			continue
		}
		out = append(out, p)
		i = p.End
	}
	return out
}

func parsePlaceholder(s string, start int) (Placeholder, bool) {
	k := start + 2
	nameStart := k
	for k < len(s) && isNameByte(s[k], k == nameStart) {
		k++
	}
	if k == nameStart || k >= len(s) {
		return Placeholder{}, false
	}
	p := Placeholder{Name: s[nameStart:k], Start: start}
	switch s[k] {
	case '}':
		p.End = k + 1
		return p, true
	case ':':
		end := strings.IndexByte(s[k+1:], '}')
		// A default never spans lines: config.yaml is expanded before it
		// is parsed, and a swallowed line break would shift every line
		// number after it.
		if end < 0 || strings.ContainsAny(s[k+1:k+1+end], "\r\n") {
			return Placeholder{}, false
		}
		p.Default = s[k+1 : k+1+end]
		p.HasDefault = true
		p.End = k + 1 + end + 1
		return p, true
	default:
		return Placeholder{}, false
	}
}

func isNameByte(c byte, first bool) bool {
	switch {
	case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		return true
	case c >= '0' && c <= '9':
		return !first
	}
	return false
}

// IsSinglePlaceholder reports whether s is exactly one placeholder and
// nothing else; such a value takes the type of what it expands to.
func IsSinglePlaceholder(s string) bool {
	ps := Placeholders(s)
	return len(ps) == 1 && ps[0].Start == 0 && ps[0].End == len(s)
}

// Expand replaces every placeholder of s. A variable that is set (even to
// "") wins over the default; a placeholder whose variable is unset and that
// has no default is left as written and its name is returned in unresolved,
// so each caller decides: config.yaml refuses it, the configuration worker
// returns it verbatim. defaults, when non-nil, rewrites a default before use
// (the configuration worker maps __III_ENGINE_VERSION__ to the version).
func Expand(s string, lookup LookupFunc, defaults func(string) string) (out string, unresolved []string) {
	ps := Placeholders(s)
	if len(ps) == 0 {
		return s, nil
	}
	var b strings.Builder
	last := 0
	for _, p := range ps {
		b.WriteString(s[last:p.Start])
		last = p.End
		if v, ok := lookup(p.Name); ok {
			b.WriteString(v)
			continue
		}
		if p.HasDefault {
			d := p.Default
			if defaults != nil {
				d = defaults(d)
			}
			b.WriteString(d)
			continue
		}
		unresolved = append(unresolved, p.Name)
		b.WriteString(s[p.Start:p.End])
	}
	b.WriteString(s[last:])
	return b.String(), unresolved
}
