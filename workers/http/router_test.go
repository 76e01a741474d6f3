package httpworker

import (
	"errors"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestParseTemplate(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"users/:id", "/users/:id", ""},
		{"/users/{id}", "/users/:id", ""},
		{"/users/{id}/", "/users/:id", ""},
		{"//a///b", "/a/b", ""},
		{"", "/", ""},
		{"/", "/", ""},
		{"/a/:", "", "needs a name"},
		{"/a/{}", "", "needs a name"},
		{"/a/:x/:x", "", "appears twice"},
		{"/a/{x", "", "neither a literal"},
		{"/a/:x-y", "", "needs a name"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			tpl, err := ParseTemplate(tc.in)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, tpl.String(), tc.want)
			assert.Equal(t, Template{segs: tpl.segs}.String(), tc.want, "made, not parsed")
		})
	}
}

func mustRoute(t *testing.T, id, method, path string) *Route {
	t.Helper()
	tpl, err := ParseTemplate(path)
	assert.NilError(t, err)
	return &Route{TriggerID: id, Method: method, Template: tpl, FunctionID: "fn::" + id}
}

func TestRouterMatch(t *testing.T) {
	rt := NewRouter()
	for _, r := range []*Route{
		mustRoute(t, "users", "GET", "/users/:id"),
		mustRoute(t, "me", "GET", "/users/me"),
		mustRoute(t, "posts", "GET", "/users/:id/posts/:post"),
		mustRoute(t, "lit2", "GET", "/:a/b"),
		mustRoute(t, "create", "POST", "/users"),
		mustRoute(t, "root", "GET", "/"),
	} {
		assert.NilError(t, rt.Add(r))
	}
	for _, tc := range []struct {
		method, path, want string
		params             map[string]string
		allowed            []string
	}{
		{"GET", "/users/42", "users", map[string]string{"id": "42"}, nil},
		{"GET", "/users/42/", "users", map[string]string{"id": "42"}, nil},
		{"GET", "//users//42", "users", map[string]string{"id": "42"}, nil},
		{"GET", "/users/me", "me", map[string]string{}, nil},
		{"GET", "/users/7/posts/9", "posts", map[string]string{"id": "7", "post": "9"}, nil},
		{"GET", "/users/b", "users", map[string]string{"id": "b"}, nil}, // literal first segment beats :a
		{"GET", "/x/b", "lit2", map[string]string{"a": "x"}, nil},
		{"GET", "/", "root", map[string]string{}, nil},
		{"GET", "/nope/nope/nope", "", nil, nil},
		{"DELETE", "/users", "", nil, []string{"POST"}},
		{"POST", "/users/me", "", nil, []string{"GET"}},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			segs, ok := SplitPath(tc.path)
			assert.Assert(t, ok)
			r, params, allowed := rt.Match(tc.method, segs)
			if tc.want == "" {
				assert.Check(t, r == nil)
				assert.Check(t, is.DeepEqual(allowed, tc.allowed))
				return
			}
			assert.Assert(t, r != nil)
			assert.Check(t, is.Equal(r.TriggerID, tc.want))
			assert.Check(t, is.DeepEqual(params, tc.params))
		})
	}
}

func TestRouterConflicts(t *testing.T) {
	rt := NewRouter()
	assert.NilError(t, rt.Add(mustRoute(t, "a", "GET", "/a/:x")))
	err := rt.Add(mustRoute(t, "b", "GET", "/a/:y"))
	var ce *ConflictError
	assert.Assert(t, errors.As(err, &ce))
	assert.Equal(t, err.Error(), "Route 'GET /a/:y' conflicts with 'GET /a/:x'")
	assert.ErrorContains(t, rt.Add(mustRoute(t, "c", "GET", "a/{x}/")), "conflicts with")
	// Another method, or another shape, is no conflict.
	assert.NilError(t, rt.Add(mustRoute(t, "d", "POST", "/a/:y")))
	assert.NilError(t, rt.Add(mustRoute(t, "e", "GET", "/a/lit")))
	// The same trigger id replaces its route.
	assert.NilError(t, rt.Add(mustRoute(t, "a", "GET", "/z/:x")))
	assert.NilError(t, rt.Add(mustRoute(t, "b", "GET", "/a/:y")))
	rt.Remove("b")
	assert.NilError(t, rt.Add(mustRoute(t, "f", "GET", "/a/:q")))
	assert.Equal(t, rt.Len(), 4) // a, d, e, f
}

func TestSplitPathDepth(t *testing.T) {
	deep := ""
	for range maxPathSegments + 1 {
		deep += "/x"
	}
	_, ok := SplitPath(deep)
	assert.Check(t, !ok)
	_, err := ParseTemplate(deep)
	assert.ErrorContains(t, err, "more than")
}
