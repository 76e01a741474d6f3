package pluginhost

import (
	"crypto/sha256"
	"crypto/subtle"
)

// authorize checks the token a caller of fn presented against the engine
// token. Both sides are hashed first, so the comparison takes the same time
// whatever the token's length and wherever the values differ. The error
// says what is missing, never what the token is.
func (h *Host) authorize(fn, presented string) error {
	if h.opts.Token == nil {
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
		return errBody(CodeUnauthorized, "%s needs the engine token: this engine has one (engine_token in config.yaml or III_ENGINE_TOKEN); pass it as the token field. Compose sends its project token itself (docs/project-token.md)", fn)
	}
	return errBody(CodeUnauthorized, "%s: the token does not match this engine's engine token (docs/project-token.md)", fn)
}
