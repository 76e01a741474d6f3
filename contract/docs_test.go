package contract

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// docEntry is what docs/sandbox-errors.md says about one code.
type docEntry struct {
	title, typ, retryable string
	sections              map[string]bool
}

// parseErrorsDoc reads the index table and the per-code entries.
func parseErrorsDoc(t *testing.T, path string) (rows []string, rowInfo map[string][3]string, entries map[string]*docEntry, order []string) {
	t.Helper()
	var (
		docHeading = regexp.MustCompile(`^## (S[0-9]{3})$`)
		docSummary = regexp.MustCompile("^\\*\\*(.+)\\*\\* — type `([a-z]+)`, retryable: (yes|no)\\.$")
		docRow     = regexp.MustCompile(`^\| \[(S[0-9]{3})\]\(#(s[0-9]{3})\) \| ([a-z]+) \| (yes|no) \| (.+) \|$`)
		docSection = regexp.MustCompile(`^\*\*(Meaning|When it happens|What to do)\.\*\*`)
	)
	f, err := os.Open(path)
	assert.NilError(t, err)
	defer f.Close()
	rowInfo = map[string][3]string{}
	entries = map[string]*docEntry{}
	var cur *docEntry
	expectSummary := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := docRow.FindStringSubmatch(line); m != nil {
			assert.Equal(t, m[2], strings.ToLower(m[1]), "the index links %s to the wrong anchor", m[1])
			rows = append(rows, m[1])
			rowInfo[m[1]] = [3]string{m[3], m[4], m[5]}
			continue
		}
		if m := docHeading.FindStringSubmatch(line); m != nil {
			_, dup := entries[m[1]]
			assert.Assert(t, !dup, "%s has two entries", m[1])
			cur = &docEntry{sections: map[string]bool{}}
			entries[m[1]] = cur
			order = append(order, m[1])
			expectSummary = true
			continue
		}
		if strings.HasPrefix(line, "## ") {
			cur = nil
			continue
		}
		if cur == nil || strings.TrimSpace(line) == "" {
			continue
		}
		if expectSummary {
			m := docSummary.FindStringSubmatch(line)
			assert.Assert(t, m != nil, "the line after ## %s must be its summary, got %q", order[len(order)-1], line)
			cur.title, cur.typ, cur.retryable = m[1], m[2], m[3]
			expectSummary = false
			continue
		}
		if m := docSection.FindStringSubmatch(line); m != nil {
			cur.sections[m[1]] = true
		}
	}
	assert.NilError(t, sc.Err())
	return rows, rowInfo, entries, order
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// TestErrorsDocMatchesTable fails when docs/sandbox-errors.md and the code
// table disagree: a code missing on either side, a wrong type, retryability
// or title, an entry without its three parts, or a broken anchor.
func TestErrorsDocMatchesTable(t *testing.T) {
	rows, rowInfo, entries, order := parseErrorsDoc(t, "../docs/sandbox-errors.md")
	table := Codes()
	var codes []string
	for _, c := range table {
		codes = append(codes, string(c.Code))
	}
	assert.DeepEqual(t, rows, codes)
	assert.DeepEqual(t, order, codes)
	for _, c := range table {
		code := string(c.Code)
		e := entries[code]
		title := strings.ToUpper(c.Title[:1]) + c.Title[1:]
		assert.Equal(t, e.title, title, code)
		assert.Equal(t, e.typ, c.Type, code)
		assert.Equal(t, e.retryable, yesNo(c.Retryable), code)
		assert.Equal(t, rowInfo[code], [3]string{c.Type, yesNo(c.Retryable), c.Title}, code)
		for _, s := range []string{"Meaning", "When it happens", "What to do"} {
			assert.Assert(t, e.sections[s], "%s lacks **%s.**", code, s)
		}
		// The anchor GitHub and the docs site derive from "## S001".
		assert.Assert(t, strings.HasSuffix(DocsURL(c.Code), "#"+strings.ToLower(code)))
	}
}
