package docblocks

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestParse(t *testing.T) {
	files, steps, err := Parse("p.md", "<!-- file: a/b.yaml -->\n```yaml\nx: 1\n```\ntext\n<!-- run: s -->\n```sh\necho\n```\n")
	assert.NilError(t, err)
	assert.DeepEqual(t, files, map[string]string{"a/b.yaml": "x: 1\n"})
	assert.DeepEqual(t, steps, []string{"echo\n"})
	for _, tc := range []struct{ doc, err string }{
		{"<!-- file: a -->\ntext\n", "p.md:1: a marker must be followed by a fenced block"},
		{"<!-- run: a -->\n```sh\necho\n", "not closed"},
		{"<!-- file: a -->\n```\n1\n```\n<!-- file: a -->\n```\n2\n```\n", "shown twice"},
		{"<!-- file: a -->", "must be followed"},
	} {
		_, _, err := Parse("p.md", tc.doc)
		assert.Check(t, is.ErrorContains(err, tc.err), tc.doc)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("<!-- file: a -->\n```\nx\n```\n")
	f.Add("<!-- run: s -->\n```sh\n")
	f.Fuzz(func(t *testing.T, doc string) { _, _, _ = Parse("fuzz", doc) })
}
