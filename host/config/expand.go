package config

import "github.com/iii-sandbox/iii/internal/envexpand"

// The ${NAME:default} syntax lives in internal/envexpand, shared with
// Compose and workerkit; these names keep config's callers unchanged.

// LookupFunc reads one environment variable; os.LookupEnv fits. Passing it
// in keeps parsing free of process state, so tests and the fuzzer control
// the environment.
type LookupFunc = envexpand.LookupFunc

// Placeholder is one ${NAME} or ${NAME:default} found in a string.
type Placeholder = envexpand.Placeholder

// Placeholders lists the placeholders of s in order (envexpand.Placeholders).
func Placeholders(s string) []Placeholder { return envexpand.Placeholders(s) }

// IsSinglePlaceholder reports whether s is exactly one placeholder and
// nothing else (envexpand.IsSinglePlaceholder).
func IsSinglePlaceholder(s string) bool { return envexpand.IsSinglePlaceholder(s) }

// Expand replaces every placeholder of s (envexpand.Expand).
func Expand(s string, lookup LookupFunc, defaults func(string) string) (out string, unresolved []string) {
	return envexpand.Expand(s, lookup, defaults)
}
