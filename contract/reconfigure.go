package contract

import (
	"errors"
	"strings"
)

// Reloading a running adapter's configuration (issue 23): an adapter that
// announces CapabilityReconfigure in adapter::info accepts Configure again
// while it runs. It applies a new configuration whose changed keys it can
// change live, atomically, and answers nil; when a changed key needs a new
// process it changes nothing and answers the error RestartRequired builds
// (code CodeRestartRequired), and the host restarts it instead. A host
// never sends a second Configure to an adapter without the capability.

// CapabilityReconfigure is the adapter::info capability of an adapter that
// accepts Configure again while it runs.
const CapabilityReconfigure = "reconfigure"

// CodeRestartRequired is the code of a repeated Configure's refusal when a
// changed key cannot change in a running process. It is not an S-code:
// only hosts see it, never a sandbox caller.
const CodeRestartRequired Code = "RESTART_REQUIRED"

// RestartRequired is the refusal of a repeated Configure: keys name the
// changed keys the running adapter cannot change live.
func RestartRequired(keys []string) *Error {
	return &Error{
		Type:    TypeConfig,
		Code:    CodeRestartRequired,
		Message: "the running adapter cannot change " + strings.Join(keys, ", ") + " live; restart it to apply the new configuration",
		FixNote: "the host restarts the adapter with the new configuration",
	}
}

// IsRestartRequired reports whether err is RestartRequired's refusal, as
// the adapter returned it or as a host's adapterrpc.Client received it (inside a
// *ConfigRejectedError).
func IsRestartRequired(err error) bool {
	var rej *ConfigRejectedError
	if errors.As(err, &rej) {
		return rej.Err != nil && rej.Err.Code == CodeRestartRequired
	}
	var e *Error
	return errors.As(err, &e) && e.Code == CodeRestartRequired
}
