package composefile

import (
	"fmt"
	"strings"

	"github.com/iii-sandbox/iii/compose"
)

// LookupFunc reads one variable of Compose's own environment; os.LookupEnv
// fits. It is passed in so parsing never reads process state behind the
// caller's back (tests and the fuzzer control the environment).
type LookupFunc = func(name string) (string, bool)

// Interpolate expands the Compose references of spec §5.3 in s:
//
//	${VAR}       the variable's value; unset is UNDEFINED_VARIABLE
//	${VAR:-text} the value, or text when VAR is unset
//	$VAR         left alone, so shell scripts keep their own variables
//	$${VAR}      a literal ${VAR}
//
// A "$" that does not start "${" or "$${" is plain text (so "$$" alone,
// the shell's PID, survives). Returned errors are *compose.Error without a
// location; callers add the file and line.
func Interpolate(s string, lookup LookupFunc) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '$' {
			b.WriteByte(c)
			i++
			continue
		}
		// "$${" is the escape for a literal "${".
		if strings.HasPrefix(s[i:], "$${") {
			b.WriteString("${")
			i += 3
			continue
		}
		if !strings.HasPrefix(s[i:], "${") {
			b.WriteByte(c)
			i++
			continue
		}
		ref, end, err := parseReference(s, i)
		if err != nil {
			return "", err
		}
		v, ok := "", false
		if lookup != nil {
			v, ok = lookup(ref.name)
		}
		switch {
		case ok:
			b.WriteString(v)
		case ref.hasDefault:
			b.WriteString(ref.def)
		default:
			return "", compose.New(compose.CodeUndefinedVariable, fmt.Sprintf(
				"${%s} is not set in Compose's environment; set %s, write ${%s:-default} to give a default, or $${%s} for a literal ${%s}",
				ref.name, ref.name, ref.name, ref.name, ref.name))
		}
		i = end
	}
	return b.String(), nil
}

type reference struct {
	name       string
	def        string
	hasDefault bool
}

// parseReference reads the reference starting at s[start:] == "${..." and
// returns it with the index just past its closing brace.
func parseReference(s string, start int) (reference, int, error) {
	body := s[start+2:]
	closing := strings.IndexByte(body, '}')
	if closing < 0 {
		return reference{}, 0, compose.New(compose.CodeUnterminatedReference, fmt.Sprintf(
			"%q opens a reference with ${ but never closes it; write ${NAME} or ${NAME:-default}, or $${ for a literal ${",
			clip(s[start:], 40)))
	}
	inner := body[:closing]
	end := start + 2 + closing + 1
	name, rest := inner, ""
	hasDefault := false
	if k := strings.Index(inner, ":-"); k >= 0 {
		name, rest, hasDefault = inner[:k], inner[k+2:], true
	}
	if !validVarName(name) {
		hint := "a name is a letter or _ followed by letters, digits or _"
		switch {
		case strings.Contains(name, ":"):
			// The engine's config.yaml syntax has a single colon; say so,
			// because that is the usual way to get here.
			hint = "Compose writes a default as ${NAME:-default} (config.yaml's ${NAME:default} form is not Compose syntax)"
		case name == "":
			hint = "the name is empty"
		}
		return reference{}, 0, compose.New(compose.CodeInvalidReference, fmt.Sprintf(
			"%q is not a valid reference: %s; write ${NAME} or ${NAME:-default}, or $${ for a literal ${",
			s[start:end], hint))
	}
	if strings.Contains(rest, "${") {
		return reference{}, 0, compose.New(compose.CodeInvalidReference, fmt.Sprintf(
			"%q nests a reference inside a default, which Compose does not expand; write the default as plain text",
			s[start:end]))
	}
	return reference{name: name, def: rest, hasDefault: hasDefault}, end, nil
}

func validVarName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// clip shortens s for a message so one bad value cannot flood the output.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary.
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
