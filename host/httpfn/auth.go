package httpfn

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strconv"

	"github.com/iii-sandbox/iii/protocol"
)

// Error codes of auth resolution at registration (upstream's).
const (
	CodeSecretNotFound = "secret_not_found"
	CodeTokenNotFound  = "token_not_found"
	CodeAPIKeyNotFound = "api_key_not_found"
	// CodeInvalidArgument is an invocation reference this engine cannot
	// use: an unknown method or auth type, a bad header.
	CodeInvalidArgument = "invalid_argument"
)

// Auth kinds of an invocation's auth object ({"type": …}).
const (
	AuthHMAC   = "hmac"
	AuthBearer = "bearer"
	AuthAPIKey = "api_key"
)

// authRef is the auth object as registered: it names environment
// variables of the engine's process, never the secrets themselves.
type authRef struct {
	Type      string `json:"type"`
	SecretKey string `json:"secret_key"`
	TokenKey  string `json:"token_key"`
	Header    string `json:"header"`
	ValueKey  string `json:"value_key"`
}

// auth is an authRef resolved at registration.
type auth struct {
	kind   string
	secret string // hmac secret, bearer token or api key value
	header string // api_key only
}

// resolveAuth reads the variables raw names through lookup. nil raw (or
// JSON null) is no auth.
func resolveAuth(raw json.RawMessage, lookup func(string) (string, bool)) (*auth, *protocol.ErrorBody) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var r authRef
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "invocation.auth must be an object {type: hmac|bearer|api_key, …}: " + err.Error()}
	}
	get := func(key, code, what string) (string, *protocol.ErrorBody) {
		if key == "" {
			return "", &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "invocation.auth of type " + r.Type + " names no environment variable"}
		}
		v, ok := lookup(key)
		if !ok {
			return "", &protocol.ErrorBody{Code: code, Message: what + " not found: " + key + " is not set in the engine's environment"}
		}
		return v, nil
	}
	switch r.Type {
	case AuthHMAC:
		s, errb := get(r.SecretKey, CodeSecretNotFound, "Secret")
		return &auth{kind: AuthHMAC, secret: s}, errb
	case AuthBearer:
		s, errb := get(r.TokenKey, CodeTokenNotFound, "Token")
		return &auth{kind: AuthBearer, secret: s}, errb
	case AuthAPIKey:
		if !validHeaderName(r.Header) {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "invocation.auth.header " + strconv.Quote(r.Header) + " is not a valid HTTP header name"}
		}
		s, errb := get(r.ValueKey, CodeAPIKeyNotFound, "API key")
		return &auth{kind: AuthAPIKey, secret: s, header: r.Header}, errb
	default:
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "invocation.auth.type " + strconv.Quote(r.Type) + " is not hmac, bearer or api_key"}
	}
}

// Sign is the x-iii-Signature of a request: "sha256=" and the hex
// HMAC-SHA256, keyed by secret, of "<timestamp>:<base64 of body>"
// (standard base64 with padding).
func Sign(body []byte, secret string, timestamp int64) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(strconv.FormatInt(timestamp, 10) + ":" + base64.StdEncoding.EncodeToString(body)))
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}
