package httpworker

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
)

// maxPathSegments bounds a route template and a request path's depth.
const maxPathSegments = 64

// segment is one path segment of a route: a literal or a :param.
type segment struct {
	lit   string
	param string // non-empty: a parameter
}

// Template is a parsed api_path.
type Template struct {
	segs []segment
	// str is String's answer, made once: every request's payload carries it.
	str string
}

// ParseTemplate parses an api_path: segments separated by "/", empty ones
// ignored (so the leading slash is optional and a trailing one does not
// matter), ":name" or "{name}" a parameter.
func ParseTemplate(apiPath string) (Template, error) {
	if len(apiPath) > 4096 {
		return Template{}, fmt.Errorf("api_path is longer than 4096 bytes")
	}
	var t Template
	seen := map[string]bool{}
	for _, s := range strings.Split(apiPath, "/") {
		if s == "" {
			continue
		}
		var name string
		switch {
		case strings.HasPrefix(s, ":"):
			name = s[1:]
		case strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") && len(s) >= 2:
			name = s[1 : len(s)-1]
		default:
			if strings.ContainsAny(s, "{}?#") {
				return Template{}, fmt.Errorf("api_path %q: segment %q is neither a literal nor a parameter (:name or {name})", apiPath, s)
			}
			t.segs = append(t.segs, segment{lit: s})
			continue
		}
		if !validParam(name) {
			return Template{}, fmt.Errorf("api_path %q: parameter %q needs a name of letters, digits and _", apiPath, s)
		}
		if seen[name] {
			return Template{}, fmt.Errorf("api_path %q: parameter :%s appears twice", apiPath, name)
		}
		seen[name] = true
		t.segs = append(t.segs, segment{param: name})
	}
	if len(t.segs) > maxPathSegments {
		return Template{}, fmt.Errorf("api_path %q has more than %d segments", apiPath, maxPathSegments)
	}
	t.str = t.build()
	return t, nil
}

func validParam(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// String is the normalized template: "/a/:b" ("/" for the root).
func (t Template) String() string {
	if t.str != "" {
		return t.str
	}
	return t.build()
}

func (t Template) build() string {
	if len(t.segs) == 0 {
		return "/"
	}
	var b strings.Builder
	for _, s := range t.segs {
		b.WriteByte('/')
		if s.param != "" {
			b.WriteByte(':')
			b.WriteString(s.param)
		} else {
			b.WriteString(s.lit)
		}
	}
	return b.String()
}

// shape is the template with parameter names erased: two routes of one
// method and one shape would match the same requests.
func (t Template) shape() string {
	var b strings.Builder
	for _, s := range t.segs {
		b.WriteByte('/')
		if s.param != "" {
			b.WriteByte(':')
		} else {
			b.WriteString(s.lit)
		}
	}
	return b.String()
}

// match returns the parameters when segs matches the template.
func (t Template) match(segs []string) (map[string]string, bool) {
	if len(segs) != len(t.segs) {
		return nil, false
	}
	for i, s := range t.segs {
		if s.param == "" && s.lit != segs[i] {
			return nil, false
		}
	}
	params := map[string]string{}
	for i, s := range t.segs {
		if s.param != "" {
			params[s.param] = segs[i]
		}
	}
	return params, true
}

// beats: at the first segment where they differ in kind, a literal wins.
func (t Template) beats(o Template) bool {
	for i := range t.segs {
		a, b := t.segs[i].param == "", o.segs[i].param == ""
		if a != b {
			return a
		}
	}
	return false
}

// Route is one registered http trigger.
type Route struct {
	TriggerID   string
	Method      string
	Template    Template
	FunctionID  string
	Namespace   string // the function's ("" = default)
	Metadata    []byte
	Condition   string
	Middlewares []string
}

// Label is "GET /a/:b", as upstream's messages name a route.
func (r *Route) Label() string { return r.Method + " " + r.Template.String() }

// Router holds the routes; safe for concurrent use.
type Router struct {
	mu      sync.RWMutex
	byID    map[string]*Route
	byShape map[string]*Route // method + shape
}

// NewRouter is an empty router.
func NewRouter() *Router {
	return &Router{byID: map[string]*Route{}, byShape: map[string]*Route{}}
}

// ConflictError is a route whose method and shape another trigger holds.
type ConflictError struct{ New, Old string }

func (e *ConflictError) Error() string {
	return fmt.Sprintf("Route '%s' conflicts with '%s'", e.New, e.Old)
}

// Add registers r; a trigger id registered again replaces its route.
func (rt *Router) Add(r *Route) error {
	key := r.Method + " " + r.Template.shape()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if old, ok := rt.byShape[key]; ok && old.TriggerID != r.TriggerID {
		return &ConflictError{New: r.Label(), Old: old.Label()}
	}
	if prev, ok := rt.byID[r.TriggerID]; ok {
		delete(rt.byShape, prev.Method+" "+prev.Template.shape())
	}
	rt.byID[r.TriggerID] = r
	rt.byShape[key] = r
	return nil
}

// Remove drops a trigger's route.
func (rt *Router) Remove(triggerID string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if prev, ok := rt.byID[triggerID]; ok {
		delete(rt.byShape, prev.Method+" "+prev.Template.shape())
		delete(rt.byID, triggerID)
	}
}

// Len is the number of routes.
func (rt *Router) Len() int {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	return len(rt.byID)
}

// SplitPath splits an escaped request path into its non-empty segments,
// each percent-decoded after the split (so an encoded "/" stays inside its
// parameter); false when deeper than any route can be.
func SplitPath(p string) ([]string, bool) {
	segs := make([]string, 0, 8)
	for s := range strings.SplitSeq(p, "/") {
		if s == "" {
			continue
		}
		if len(segs) == maxPathSegments {
			return nil, false
		}
		if d, err := url.PathUnescape(s); err == nil {
			s = d
		}
		segs = append(segs, s)
	}
	return segs, true
}

// Match finds the route for method and path segments: the most specific
// one (literals before parameters, left to right). When none matches for
// the method, allowed lists the methods that match the path (405).
func (rt *Router) Match(method string, segs []string) (r *Route, params map[string]string, allowed []string) {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	for _, c := range rt.byID {
		p, ok := c.Template.match(segs)
		if !ok {
			continue
		}
		if c.Method != method {
			if !slices.Contains(allowed, c.Method) {
				allowed = append(allowed, c.Method)
			}
			continue
		}
		if r == nil || c.Template.beats(r.Template) {
			r, params = c, p
		}
	}
	if r != nil {
		return r, params, nil
	}
	slices.Sort(allowed)
	return nil, nil, allowed
}
