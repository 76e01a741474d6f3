package pluginhost

import (
	"crypto/sha256"
	"crypto/subtle"
)

// authorize checks a call of fn. engine::adapters::start, stop and restart
// are privileged, so the engine lets only callers holding the engine token
// reach them: those (admin is Call.CallerAdmin: a connection that presented
// the token, or an in-process caller) pass. The token field in the payload
// is the older proof and still counts, so callers that send it keep
// working. Both sides are hashed first, so the comparison takes the same
// time whatever the token's length and wherever the values differ. The
// error says what is missing, never what the token is.
func (h *Host) authorize(fn, presented string, admin bool) error {
	if admin || h.opts.Token == nil {
		return nil
	}
	want := h.opts.Token()
	if want == "" {
		return nil
	}
	a, b := sha256.Sum256([]byte(want)), sha256.Sum256([]byte(presented))
	if subtle.ConstantTimeCompare(a[:], b[:]) == 1 && presented != "" {
		return nil
	}
	if presented == "" {
		return errBody(CodeUnauthorized, "%s needs the engine token: connect with it (Authorization: Bearer; iii call and iii compose send the same user's token themselves). docs/security.md", fn)
	}
	return errBody(CodeUnauthorized, "%s: the token does not match this engine's engine token (docs/project-token.md)", fn)
}
