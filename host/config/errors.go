package config

import "fmt"

// Stable error codes of config.yaml. docs/config-yaml.md has an entry for
// each with its fix; scripts and tests match on the code, never the text.
const (
	// CodeInvalidConfig: the file is not valid YAML or does not have the
	// shape config.yaml must have (unknown or duplicate key, wrong type,
	// value out of range).
	CodeInvalidConfig = "INVALID_CONFIG"
	// CodeInvalidNamespace: sandbox.namespace is not [a-z0-9_-]+.
	CodeInvalidNamespace = "INVALID_NAMESPACE"
	// CodeUnsetVariable: a ${VAR} placeholder names an unset variable and
	// has no default.
	CodeUnsetVariable = "UNSET_VARIABLE"
	// CodeUnsupportedConfigWorkers: workers: declares a name 0.26 does not
	// allow there (project workers, iii-sandbox, injected workers).
	CodeUnsupportedConfigWorkers = "UNSUPPORTED_CONFIG_WORKERS"
	// CodeWorkerNotSupported: an allowed 0.26 worker this engine does not
	// implement. Every one is implemented now, so it is not returned; the
	// code stays reserved for scripts that match on it.
	CodeWorkerNotSupported = "WORKER_NOT_SUPPORTED"
	// CodeConfigNotFound: the file is missing and the user declined to
	// create it, or it disappeared while the engine ran.
	CodeConfigNotFound = "CONFIG_NOT_FOUND"
	// CodeConfigUnreadable: the file exists but cannot be read or created.
	CodeConfigUnreadable = "CONFIG_UNREADABLE"
)

// Error is a config.yaml problem a user must fix. Message names the file
// (and line where there is one) and says what to do.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
