package config

import (
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// docSections are the tables of docs/config-yaml.md that list keys, by
// heading, with the YAML that puts a key under each one's config.
var docSections = []struct {
	heading string
	// wrap places a flow mapping where the section's keys live.
	wrap func(inner string) string
}{
	{"## Top level", func(in string) string { return in }},
	{"### `iii-worker-manager`", workerWrap("iii-worker-manager")},
	{"### `configuration`", workerWrap("configuration")},
	{"### `iii-http-functions`", workerWrap("iii-http-functions")},
	{"### `iii-stream`", workerWrap("iii-stream")},
	{"## `sandbox:`", func(in string) string { return "sandbox: " + in }},
}

func workerWrap(name string) func(string) string {
	return func(in string) string { return "workers:\n  - name: " + name + "\n    config: " + in + "\n" }
}

var docKeyRow = regexp.MustCompile("^\\| `([a-z_.]+)` \\|")

// documentedKeys returns the keys in the first table after heading, as
// written (dotted for nested keys).
func documentedKeys(t *testing.T, doc, heading string) []string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	assert.Assert(t, i >= 0, "docs/config-yaml.md has no heading %q", heading)
	var keys []string
	inTable := false
	for _, line := range strings.Split(doc[i+len(heading)+2:], "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		if m := docKeyRow.FindStringSubmatch(line); m != nil {
			keys = append(keys, m[1])
			inTable = true
			continue
		}
		if inTable && !strings.HasPrefix(line, "|") {
			break
		}
	}
	assert.Assert(t, len(keys) > 0, "no key table under %q", heading)
	return keys
}

// allowedKeys asks the parser which keys it takes at parent (dotted, ""
// for the section itself) by writing an unknown one there, and reads them
// from its error.
func allowedKeys(t *testing.T, wrap func(string) string, parent string, extra map[string]string) []string {
	t.Helper()
	inner := "{zz_not_a_key: 1}"
	if parent != "" {
		parts := strings.Split(parent, ".")
		for j := len(parts) - 1; j >= 0; j-- {
			siblings := ""
			if v, ok := extra[strings.Join(parts[:j], ".")]; ok {
				siblings = ", " + v
			}
			inner = "{" + parts[j] + ": " + inner + siblings + "}"
		}
	}
	_, err := ParseFile("/srv/engine/config.yaml", []byte(wrap(inner)), func(string) (string, bool) { return "", false })
	assert.Assert(t, err != nil, "an unknown key under %q was accepted", parent)
	msg := err.Error()
	list := ""
	for _, marker := range []string{"allowed keys: ", "has only "} {
		if _, after, ok := strings.Cut(msg, marker); ok {
			list = after
			break
		}
	}
	assert.Assert(t, list != "", "the parser's error names no allowed keys: %s", msg)
	list = strings.ReplaceAll(list, " and ", ", ")
	var keys []string
	for _, k := range strings.Split(list, ", ") {
		keys = append(keys, strings.TrimSpace(k))
	}
	return keys
}

// Every key docs/config-yaml.md lists is one the parser takes, and every
// key the parser takes is listed: the page cannot drift from the code.
func TestConfigDocListsEveryKey(t *testing.T) {
	raw, err := os.ReadFile("../../docs/config-yaml.md")
	assert.NilError(t, err)
	doc := string(raw)
	for _, sec := range docSections {
		t.Run(sec.heading, func(t *testing.T) {
			byParent := map[string][]string{}
			for _, k := range documentedKeys(t, doc, sec.heading) {
				parent, leaf := "", k
				if i := strings.LastIndex(k, "."); i >= 0 {
					parent, leaf = k[:i], k[i+1:]
				}
				byParent[parent] = append(byParent[parent], leaf)
				// A nested key's parents are keys of their own level.
				for p := parent; p != ""; {
					up, name := "", p
					if i := strings.LastIndex(p, "."); i >= 0 {
						up, name = p[:i], p[i+1:]
					}
					if !slices.Contains(byParent[up], name) {
						byParent[up] = append(byParent[up], name)
					}
					p = up
				}
			}
			for parent, documented := range byParent {
				allowed := allowedKeys(t, sec.wrap, parent, nil)
				// iii-stream's adapter.config keys depend on the adapter:
				// the page lists kv's and redis's together.
				if sec.heading == "### `iii-stream`" && parent == "adapter.config" {
					allowed = append(allowed, allowedKeys(t, sec.wrap, parent, map[string]string{"adapter": "name: redis"})...)
				}
				sort.Strings(documented)
				allowed = slices.Compact(slices.Sorted(slices.Values(allowed)))
				assert.DeepEqual(t, documented, allowed)
			}
		})
	}
}
