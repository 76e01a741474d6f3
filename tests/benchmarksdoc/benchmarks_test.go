// Package benchmarksdoc keeps BENCHMARKS.md honest about its own rules:
// one label per row, every row with a floor and a ratio, and every
// "Reproduce" command naming a harness that exists in the tree.
package benchmarksdoc

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

const root = "../.."

type row struct {
	label, floor, ratio, reproduce string
}

// rows reads the figures table: the lines that start with "| <label> |".
func rows(t *testing.T) []row {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "BENCHMARKS.md"))
	assert.NilError(t, err)
	var out []row
	header := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "| # | Figure |") {
			header = true
			continue
		}
		if !header || strings.HasPrefix(line, "| ---") {
			continue
		}
		if !strings.HasPrefix(line, "| ") {
			if len(out) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		assert.Equal(t, len(cells), 7, "a row of BENCHMARKS.md's table has %d cells, not 7: %s", len(cells), line)
		out = append(out, row{label: strings.TrimSpace(cells[0]), floor: strings.TrimSpace(cells[3]), ratio: strings.TrimSpace(cells[4]), reproduce: strings.TrimSpace(cells[6])})
	}
	assert.Assert(t, len(out) > 10, "found %d rows in BENCHMARKS.md's table", len(out))
	return out
}

func TestOneLabelPerRow(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range rows(t) {
		assert.Assert(t, r.label != "", "a row without a label")
		assert.Assert(t, !seen[r.label], "two rows are labelled %s", r.label)
		seen[r.label] = true
	}
}

func TestEveryRowHasFloorAndRatio(t *testing.T) {
	for _, r := range rows(t) {
		for what, v := range map[string]string{"floor": r.floor, "ratio": r.ratio} {
			assert.Assert(t, v != "" && v != "—" && !strings.HasPrefix(v, "— "), "row %s has no %s", r.label, what)
		}
	}
}

var (
	goRun   = regexp.MustCompile(`go run \./(scripts/bench/[a-z0-9]+)`)
	script  = regexp.MustCompile("`(scripts/bench/[a-z0-9-]+\\.sh)")
	goBench = regexp.MustCompile("go test [^`]*?\\./([a-z0-9/_-]+)`")
)

func TestReproduceNamesAnExistingHarness(t *testing.T) {
	for _, r := range rows(t) {
		found := 0
		for _, m := range goRun.FindAllStringSubmatch(r.reproduce, -1) {
			found++
			_, err := os.Stat(filepath.Join(root, m[1], "main.go"))
			assert.NilError(t, err, "row %s: %s has no main.go", r.label, m[1])
		}
		for _, m := range script.FindAllStringSubmatch(r.reproduce, -1) {
			found++
			st, err := os.Stat(filepath.Join(root, m[1]))
			assert.NilError(t, err, "row %s", r.label)
			assert.Assert(t, st.Mode()&0o111 != 0, "row %s: %s is not executable", r.label, m[1])
		}
		for _, m := range goBench.FindAllStringSubmatch(r.reproduce, -1) {
			found++
			st, err := os.Stat(filepath.Join(root, m[1]))
			assert.NilError(t, err, "row %s", r.label)
			assert.Assert(t, st.IsDir(), "row %s: %s is not a package", r.label, m[1])
		}
		assert.Assert(t, found > 0, "row %s names no harness: %s", r.label, r.reproduce)
	}
}
