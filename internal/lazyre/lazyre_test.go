package lazyre

import (
	"regexp"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
)

func TestNotCompiledUntilUsed(t *testing.T) {
	r := New(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	assert.Assert(t, !r.compiled())
	assert.Equal(t, r.String(), `^[a-z0-9][a-z0-9_-]{0,63}$`)
	assert.Assert(t, !r.compiled(), "String compiled the pattern")
	assert.Assert(t, r.MatchString("sandbox-libkrun"))
	assert.Assert(t, r.compiled())
	first := r.Regexp()
	assert.Assert(t, first == r.Regexp(), "compiled twice")
}

// The lazy form answers exactly what regexp.MustCompile answers.
func TestMatchesLikeRegexp(t *testing.T) {
	cases := []struct {
		pattern string
		inputs  []string
	}{
		{`^[a-z0-9_-]+$`, []string{"", "default", "Default", "a b", "a_b-c", "é"}},
		{`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})(:[0-9]{1,5})?$`, []string{"localhost:5000", "-x", "a:123456", "example.org"}},
		{`(?i)incompatible API version with plugin\. Plugin version: (\d+)`, []string{"Incompatible API version with plugin. Plugin version: 3, Client versions: [1]", "nothing"}},
	}
	for _, tc := range cases {
		r, std := New(tc.pattern), regexp.MustCompile(tc.pattern)
		for _, in := range tc.inputs {
			assert.Equal(t, r.MatchString(in), std.MatchString(in), "%q on %q", tc.pattern, in)
			assert.DeepEqual(t, r.FindStringSubmatch(in), std.FindStringSubmatch(in))
		}
	}
}

func TestInvalidPatternPanicsOnUse(t *testing.T) {
	r := New(`(`)
	defer func() {
		v := recover()
		assert.Assert(t, v != nil, "an invalid pattern did not panic on use")
	}()
	r.MatchString("x")
}

func TestConcurrentFirstUse(t *testing.T) {
	r := New(`^[0-9a-f]{64}$`)
	var wg sync.WaitGroup
	got := make([]*regexp.Regexp, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = r.Regexp()
		}()
	}
	wg.Wait()
	for _, re := range got {
		assert.Assert(t, re == got[0], "more than one compile")
	}
}
