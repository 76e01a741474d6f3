// Package rbac is the permission model of an iii-worker-manager listener, as
// iii 0.26 defines it: the `rbac` block of the listener's config
// (auth_function_id, expose_functions and the registration hooks), the
// result an auth function returns for a connection (its session), and the
// one decision every invoke and trigger registration goes through.
//
// It holds no I/O: the engine calls the auth function and the hooks, and
// asks this package what they allow. docs/security.md records the shapes.
// It knows nothing of the engine's insides (it imports only the standard
// library), so it sits in internal/, under both the engine, which may
// import only protocol and internal/ (docs/architecture.md, "Layers"),
// and host/config, which parses the block with it.
package rbac

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// DefaultNamespace is where a rule or grant that names no namespace applies.
const DefaultNamespace = "default"

// Infrastructure are the engine builtins every session may call whatever its
// grants say (unless its forbidden_functions names them): without them a
// worker cannot register, log or open a channel. Discovery builtins
// (engine::functions::list, …) are not among them.
var Infrastructure = []string{
	"engine::channels::create",
	// A connection's own channel lease (minted refs) and its watch: they
	// reach no channel but the caller's own.
	"engine::channels::lease",
	"engine::channels::watch",
	"engine::workers::register",
	"engine::log::info",
	"engine::log::warn",
	"engine::log::error",
	"engine::log::debug",
	"engine::log::trace",
	"engine::baggage::get",
	"engine::baggage::set",
	"engine::baggage::get_all",
}

// IsInfrastructure reports whether id is one of Infrastructure.
func IsInfrastructure(id string) bool { return slices.Contains(Infrastructure, id) }

// Config is a listener's `rbac` block.
type Config struct {
	AuthFunctionID                      string   `json:"auth_function_id,omitempty"`
	ExposeFunctions                     []Filter `json:"expose_functions,omitempty"`
	OnTriggerRegistrationFunctionID     string   `json:"on_trigger_registration_function_id,omitempty"`
	OnTriggerTypeRegistrationFunctionID string   `json:"on_trigger_type_registration_function_id,omitempty"`
	OnFunctionRegistrationFunctionID    string   `json:"on_function_registration_function_id,omitempty"`
}

// ParseConfig decodes an `rbac` block strictly: an unknown key (a typo
// would silently widen or narrow access) or a malformed filter is an error.
func ParseConfig(raw []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("rbac: %w", err)
	}
	if dec.More() {
		return nil, errors.New("rbac: trailing data after the block")
	}
	return &c, nil
}

// Filter is one expose_functions rule: a wildcard on the function id, or a
// set of metadata values the function must carry, in one namespace
// (default when the rule names none).
type Filter struct {
	Match     string         // wildcard; "" for a metadata rule
	Metadata  map[string]any // exact values, or "match(\"…\")" wildcards on strings
	Namespace string         // "" = default
}

// UnmarshalJSON accepts `match("svc::*")` (or single-quoted) strings and
// maps with exactly one of match or metadata, plus an optional namespace.
func (f *Filter) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		p, ok := parseMatch(s)
		if !ok {
			return fmt.Errorf("expose_functions: expected match(\"pattern\"), got %q", s)
		}
		*f = Filter{Match: p}
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return errors.New("expose_functions: a rule is a match(\"pattern\") string or a map with match or metadata")
	}
	var out Filter
	for k, v := range m {
		switch k {
		case "match":
			if err := json.Unmarshal(v, &out.Match); err != nil {
				return errors.New("expose_functions: match must be a string")
			}
		case "metadata":
			if err := json.Unmarshal(v, &out.Metadata); err != nil || out.Metadata == nil {
				return errors.New("expose_functions: metadata must be a map")
			}
		case "namespace":
			if err := json.Unmarshal(v, &out.Namespace); err != nil || strings.TrimSpace(out.Namespace) == "" {
				return errors.New("expose_functions: namespace must be a non-blank string")
			}
		default:
			return fmt.Errorf("expose_functions: unknown key %q in a rule; expected match, metadata or namespace", k)
		}
	}
	switch {
	case out.Match != "" && len(out.Metadata) > 0:
		return errors.New("expose_functions: a rule has either match or metadata, not both")
	case out.Match == "" && len(out.Metadata) == 0:
		return errors.New("expose_functions: a rule needs a match or a metadata key")
	}
	*f = out
	return nil
}

// MarshalJSON writes the form UnmarshalJSON reads back.
func (f Filter) MarshalJSON() ([]byte, error) {
	if f.Metadata == nil && f.Namespace == "" {
		return json.Marshal(`match("` + f.Match + `")`)
	}
	m := map[string]any{}
	if f.Metadata != nil {
		m["metadata"] = f.Metadata
	} else {
		m["match"] = f.Match
	}
	if f.Namespace != "" {
		m["namespace"] = f.Namespace
	}
	return json.Marshal(m)
}

// Matches reports whether the rule exposes function id in namespace ns;
// metadata is the function's metadata (nil when it has none or is unknown).
func (f Filter) Matches(id, ns string, metadata json.RawMessage) bool {
	if or(f.Namespace, DefaultNamespace) != ns {
		return false
	}
	if f.Metadata == nil {
		return Wildcard(f.Match, id)
	}
	var have map[string]any
	if len(metadata) == 0 || json.Unmarshal(metadata, &have) != nil {
		return false
	}
	for k, want := range f.Metadata {
		got, ok := have[k]
		if !ok || !metadataMatches(want, got) {
			return false
		}
	}
	return true
}

func metadataMatches(want, got any) bool {
	if s, ok := want.(string); ok {
		if p, ok := parseMatch(s); ok {
			g, ok := got.(string)
			return ok && Wildcard(p, g)
		}
	}
	a, _ := json.Marshal(want)
	b, _ := json.Marshal(got)
	return bytes.Equal(a, b)
}

func parseMatch(s string) (string, bool) {
	t := strings.TrimSpace(s)
	if (strings.HasPrefix(t, `match("`) && strings.HasSuffix(t, `")`)) ||
		(strings.HasPrefix(t, `match('`) && strings.HasSuffix(t, `')`)) {
		if len(t) < len(`match("")`) {
			return "", false
		}
		return t[7 : len(t)-2], true
	}
	return "", false
}

// Wildcard matches value against pattern, where each * stands for any run of
// characters (possibly empty) and everything else is literal.
func Wildcard(pattern, value string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == value
	}
	if !strings.HasPrefix(value, parts[0]) {
		return false
	}
	value = value[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(value, p)
		if i < 0 {
			return false
		}
		value = value[i+len(p):]
	}
	return strings.HasSuffix(value, last)
}

// grantMatches reports whether one grant (an exact id, a bare wildcard, or a
// wrapped match("…") wildcard) covers id.
func grantMatches(grant, id string) bool {
	if p, ok := parseMatch(grant); ok {
		grant = p
	}
	return grant == id || (strings.Contains(grant, "*") && Wildcard(grant, id))
}

// Session is what an auth function returned for one connection (the same
// shape iii's engine reads), or what a scoped credential carries.
type Session struct {
	// Namespaces holds grants scoped to one namespace each; its keys are
	// also the only namespaces the connection may declare. Empty: any
	// namespace may be declared and only AllowedFunctions applies.
	Namespaces map[string][]string `json:"namespaces"`
	// AllowedFunctions are grants that name no namespace: default only.
	AllowedFunctions []string `json:"allowed_functions"`
	// ForbiddenFunctions are denials, in every namespace; they win.
	ForbiddenFunctions           []string        `json:"forbidden_functions"`
	AllowedTriggerTypes          *[]string       `json:"allowed_trigger_types"`
	AllowTriggerTypeRegistration bool            `json:"allow_trigger_type_registration"`
	AllowFunctionRegistration    bool            `json:"allow_function_registration"`
	Context                      json.RawMessage `json:"context"`
	FunctionRegistrationPrefix   string          `json:"function_registration_prefix"`
	// Declarable, when not nil, replaces the keys of Namespaces as the
	// namespaces the connection may declare: a credential the engine
	// issues grants calls in namespaces its holder does not live in.
	Declarable []string `json:"-"`
}

// DecodeAuthResult reads an auth function's result. Absent fields take
// iii's defaults: function registration allowed, trigger type registration
// not, context {}. Unknown fields are ignored (a newer auth worker may send
// more).
func DecodeAuthResult(raw json.RawMessage) (*Session, error) {
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, errors.New("auth function returned no result")
	}
	var wire struct {
		Namespaces                   map[string][]string `json:"namespaces"`
		AllowedFunctions             []string            `json:"allowed_functions"`
		ForbiddenFunctions           []string            `json:"forbidden_functions"`
		AllowedTriggerTypes          *[]string           `json:"allowed_trigger_types"`
		AllowTriggerTypeRegistration bool                `json:"allow_trigger_type_registration"`
		AllowFunctionRegistration    *bool               `json:"allow_function_registration"`
		Context                      json.RawMessage     `json:"context"`
		FunctionRegistrationPrefix   *string             `json:"function_registration_prefix"`
	}
	if err := json.Unmarshal(raw, &wire); err != nil {
		return nil, fmt.Errorf("auth function result: %w", err)
	}
	s := &Session{
		Namespaces:                   wire.Namespaces,
		AllowedFunctions:             wire.AllowedFunctions,
		ForbiddenFunctions:           wire.ForbiddenFunctions,
		AllowedTriggerTypes:          wire.AllowedTriggerTypes,
		AllowTriggerTypeRegistration: wire.AllowTriggerTypeRegistration,
		AllowFunctionRegistration:    wire.AllowFunctionRegistration == nil || *wire.AllowFunctionRegistration,
		Context:                      wire.Context,
	}
	if len(bytes.TrimSpace(s.Context)) == 0 || bytes.Equal(bytes.TrimSpace(s.Context), []byte("null")) {
		s.Context = json.RawMessage(`{}`)
	}
	for ns := range s.Namespaces {
		if strings.TrimSpace(ns) == "" {
			return nil, errors.New("auth function result: a blank namespace in namespaces")
		}
	}
	if wire.FunctionRegistrationPrefix != nil {
		p := strings.TrimSpace(*wire.FunctionRegistrationPrefix)
		if p == "" {
			return nil, errors.New("auth function result: function_registration_prefix is blank")
		}
		s.FunctionRegistrationPrefix = p
	}
	return s, nil
}

// Open is the session of a connection on a listener without an auth
// function: nothing scoped, everything registrable.
func Open() *Session {
	return &Session{AllowFunctionRegistration: true, AllowTriggerTypeRegistration: true, Context: json.RawMessage(`{}`)}
}

// MayDeclare reports whether the session may declare namespace ns on
// engine::workers::register.
func (s *Session) MayDeclare(ns string) bool {
	if s.Declarable != nil {
		return slices.Contains(s.Declarable, ns)
	}
	if len(s.Namespaces) == 0 {
		return true
	}
	_, ok := s.Namespaces[ns]
	return ok
}

// DeclarableNamespaces lists, sorted, the namespaces the session may declare.
func (s *Session) DeclarableNamespaces() []string {
	if s.Declarable != nil {
		return slices.Sorted(slices.Values(s.Declarable))
	}
	out := make([]string, 0, len(s.Namespaces))
	for ns := range s.Namespaces {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out
}

// Forbids reports whether id is in the session's forbidden_functions.
func (s *Session) Forbids(id string) bool { return slices.Contains(s.ForbiddenFunctions, id) }

// Allowed is the decision for one call (or trigger target) of function id
// in namespace ns. cfg nil means the listener has no rbac block: only the
// session's denials apply. metadata is the function's, nil when unknown.
//
// In order: a denial wins; a grant scoped to ns allows; a grant naming no
// namespace allows in default; infrastructure builtins are allowed; then
// an expose_functions rule must match, else the call is refused.
func Allowed(id, ns string, cfg *Config, s *Session, metadata json.RawMessage) bool {
	if s != nil {
		if s.Forbids(id) {
			return false
		}
		for _, g := range s.Namespaces[ns] {
			if grantMatches(g, id) {
				return true
			}
		}
		if ns == DefaultNamespace && slices.Contains(s.AllowedFunctions, id) {
			return true
		}
	}
	if IsInfrastructure(id) {
		return true
	}
	if cfg == nil {
		return true
	}
	for _, f := range cfg.ExposeFunctions {
		if f.Matches(id, ns, metadata) {
			return true
		}
	}
	return false
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
