package httpworker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/iii-sandbox/iii/protocol"
)

// envelope is the response a function returns (upstream's HttpResponse).
type envelope struct {
	StatusCode *int            `json:"status_code"`
	Headers    json.RawMessage `json:"headers"`
	Body       json.RawMessage `json:"body"`
}

// hopHeaders are the function's headers the listener does not take: they
// describe the connection, which is the listener's.
var hopHeaders = map[string]bool{"connection": true, "content-length": true, "transfer-encoding": true,
	"keep-alive": true, "upgrade": true, "te": true, "trailer": true, "proxy-connection": true}

// BuildResponse turns a function's result into status, headers and body:
//
//   - {status_code?, headers?, body?}: status_code defaults to 200 (100..999);
//     headers are {name: value} or ["Name: value", …]; body absent is {},
//     null is empty, a string with a content-type header of the
//     function's is sent as is, anything else as JSON.
//   - null (upstream's streaming answer, which this worker does not serve):
//     200 with an empty body, what a streaming handler that wrote nothing
//     gives.
//   - any other value (an object without those keys, an array, a
//     number): 200 with it as the JSON body.
func BuildResponse(out json.RawMessage) (int, http.Header, []byte, error) {
	return buildResponse(out, true)
}

// buildResponse is BuildResponse; fast false always decodes the envelope
// with encoding/json (the reference the fast path is tested against).
func buildResponse(out json.RawMessage, fast bool) (int, http.Header, []byte, error) {
	r, err := readResponse(out, fast)
	if err != nil {
		return 0, nil, nil, err
	}
	h := r.header
	if h == nil {
		h = http.Header{}
	}
	if r.jsonType {
		h.Set("Content-Type", "application/json")
	}
	return r.status, h, r.body, nil
}

// response is a function's result read as an HTTP response. WriteResponse
// adds it to the response writer's own header map: most functions send no
// headers, and a map made only to be copied was a tenth of the listener's
// allocations.
type response struct {
	status int
	header http.Header // the function's headers; nil when it sent none
	// jsonType: Content-Type is application/json (the function sent none).
	jsonType bool
	body     []byte
}

func readResponse(out json.RawMessage, fast bool) (response, error) {
	t := bytes.TrimSpace(out)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return response{status: http.StatusOK}, nil
	}
	var env envelope
	isEnvelope := false
	if t[0] == '{' {
		var ok bool
		if fast {
			env, isEnvelope, ok = scanEnvelope(t)
		}
		if !ok {
			env = envelope{}
			if err := json.Unmarshal(t, &env); err != nil {
				// Only the envelope's keys can have a wrong type.
				return response{}, fmt.Errorf("the function's response is not {status_code, headers, body}: %v", err)
			}
			isEnvelope = env.StatusCode != nil || env.Headers != nil || env.Body != nil || hasEnvelopeKeys(t)
		}
	}
	if !isEnvelope {
		return response{status: http.StatusOK, jsonType: true, body: t}, nil
	}
	r := response{status: http.StatusOK}
	if env.StatusCode != nil {
		r.status = *env.StatusCode
		if r.status < 100 || r.status > 999 {
			return response{}, fmt.Errorf("the function's status_code %d is not an HTTP status", r.status)
		}
	}
	if hv := bytes.TrimSpace(env.Headers); len(hv) > 0 && !bytes.Equal(hv, []byte("null")) {
		r.header = http.Header{}
		if err := addHeaders(r.header, hv); err != nil {
			return response{}, err
		}
	}
	body := bytes.TrimSpace(env.Body)
	switch {
	case env.Body == nil:
		body = []byte("{}")
	case bytes.Equal(body, []byte("null")):
		return r, nil
	case body[0] == '"' && r.header.Get("Content-Type") != "":
		var s string
		if err := json.Unmarshal(body, &s); err != nil {
			return response{}, err
		}
		r.body = []byte(s)
		return r, nil
	}
	r.jsonType = r.header.Get("Content-Type") == ""
	r.body = body
	return r, nil
}

// scanEnvelope is BuildResponse's fast path: the envelope read in one pass
// over the object, and whether it has any of the envelope's keys. ok is
// false, and encoding/json decides, for anything it does not take as is: a
// key that is not plain lowercase (encoding/json folds case), a
// status_code that is not a plain integer.
func scanEnvelope(obj []byte) (env envelope, present, ok bool) {
	ok = protocol.ObjectMembers(obj, func(key, val []byte) bool {
		if !protocol.PlainKey(key) {
			return false
		}
		switch string(key) {
		case "status_code":
			present = true
			if string(val) == "null" {
				env.StatusCode = nil
				return true
			}
			n, err := strconv.Atoi(string(val))
			if err != nil || bytes.ContainsAny(val, ".eE+") {
				return false
			}
			env.StatusCode = &n
		case "headers":
			present = true
			env.Headers = val
		case "body":
			present = true
			env.Body = val
		}
		return true
	})
	return env, present, ok
}

// hasEnvelopeKeys: an object whose envelope keys are all null still is
// an envelope ({"status_code": null} is a 200 with the default body).
func hasEnvelopeKeys(obj []byte) bool {
	var keys map[string]json.RawMessage
	if json.Unmarshal(obj, &keys) != nil {
		return false
	}
	for _, k := range []string{"status_code", "headers", "body"} {
		if _, ok := keys[k]; ok {
			return true
		}
	}
	return false
}

func addHeaders(h http.Header, raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	add := func(k, v string) error {
		k = strings.TrimSpace(k)
		if !validHeaderName(k) {
			return fmt.Errorf("the function's response header name %q is not valid", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("the function's response header %s holds a line break", k)
		}
		if hopHeaders[strings.ToLower(k)] {
			return nil
		}
		h.Add(k, strings.TrimSpace(v))
		return nil
	}
	switch raw[0] {
	case '{':
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("the function's headers: %v", err)
		}
		for k, v := range m {
			var s string
			var ss []string
			switch {
			case json.Unmarshal(v, &s) == nil:
				if err := add(k, s); err != nil {
					return err
				}
			case json.Unmarshal(v, &ss) == nil:
				for _, s := range ss {
					if err := add(k, s); err != nil {
						return err
					}
				}
			default:
				if err := add(k, strings.Trim(string(v), `"`)); err != nil {
					return err
				}
			}
		}
	case '[':
		var l []string
		if err := json.Unmarshal(raw, &l); err != nil {
			return fmt.Errorf("the function's headers: %v", err)
		}
		for _, line := range l {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				return fmt.Errorf("the function's header %q is not \"Name: value\"", line)
			}
			if err := add(k, v); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("the function's headers are neither {name: value} nor [\"Name: value\"]")
	}
	return nil
}

func validHeaderName(k string) bool {
	if k == "" || len(k) > 256 {
		return false
	}
	for _, r := range k {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

// WriteResponse writes a function's result as the HTTP response.
func WriteResponse(rw http.ResponseWriter, out json.RawMessage) error {
	r, err := readResponse(out, true)
	if err != nil {
		return err
	}
	dst := rw.Header()
	for k, v := range r.header {
		dst[k] = append(dst[k], v...)
	}
	if r.jsonType {
		dst["Content-Type"] = append(dst["Content-Type"], "application/json")
	}
	dst.Set("Content-Length", strconv.Itoa(len(r.body)))
	rw.WriteHeader(r.status)
	if len(r.body) > 0 {
		_, _ = rw.Write(r.body)
	}
	return nil
}
