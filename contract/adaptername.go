package contract

import "github.com/iii-sandbox/iii/internal/adaptername"

// AdapterNamePattern is the adapter-name rule as a regular expression, for
// JSON Schemas and documentation.
const AdapterNamePattern = adaptername.Pattern

// ValidAdapterName reports whether name is an adapter name: 1 to 64 of
// a-z 0-9 _ -, starting with a letter or digit. The name is the prefix of
// the adapter's functions (<adapter>::create), its worker name and its
// executable's name. config.yaml, compose files, the plugin host and the
// sandbox router all check names with it; the rule itself is in
// internal/adaptername so that host/engine, below contract, shares it.
func ValidAdapterName(name string) bool { return adaptername.Valid(name) }
