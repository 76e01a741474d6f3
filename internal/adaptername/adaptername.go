// Package adaptername holds the one rule for sandbox adapter names: the
// prefix of an adapter's functions (<adapter>::create), its worker name and
// its executable's name. contract.ValidAdapterName is the rule's public
// name; host/engine, which may import only protocol and internal/
// (docs/architecture.md, "Layers"), calls Valid here, so the rule is
// written once.
package adaptername

// Pattern is the rule as a regular expression, for JSON Schemas and
// messages; Valid is what code calls.
const Pattern = `^[a-z0-9][a-z0-9_-]{0,63}$`

// MaxLen is the longest adapter name.
const MaxLen = 64

// Valid reports whether name matches Pattern: 1 to 64 of a-z 0-9 _ -,
// starting with a letter or digit. It is written out rather than matched
// with a regexp so that it needs no package-level state.
func Valid(name string) bool {
	if len(name) == 0 || len(name) > MaxLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}
