// Package benchmarksdoc keeps BENCHMARKS.md honest about its own rules:
// one label per row, every row with a floor and a ratio, every
// "Reproduce" command naming a harness that exists in the tree, and make
// bench running each row's command as the row gives it.
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

var (
	// A row's command: the harness and its arguments, up to the closing
	// backtick.
	goRunArgs  = regexp.MustCompile("`go run \\./(scripts/bench/[a-z0-9]+)((?: [^`]*)?)`")
	scriptArgs = regexp.MustCompile("`(scripts/bench/[a-z0-9-]+\\.sh)((?: [^`]*)?)`")
	// A harness make bench runs: a line of run.sh, or its loop over every
	// scripts/bench/<name>/ run bare.
	runLine = regexp.MustCompile(`(?m)^\s*(?:go run \./(scripts/bench/[a-z0-9]+)|(scripts/bench/[a-z0-9-]+\.sh))([^|;&\n]*)`)
)

// TestMakeBenchRunsEveryRow: `make bench` (scripts/bench/run.sh) runs every
// row's command as the row gives it. A command is run when run.sh runs its
// harness with at least the row's arguments; its loop runs every Go
// harness bare, which covers rows that give none.
func TestMakeBenchRunsEveryRow(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "scripts/bench/run.sh"))
	assert.NilError(t, err)
	runs := map[string][][]string{}
	entries, err := os.ReadDir(filepath.Join(root, "scripts/bench"))
	assert.NilError(t, err)
	for _, e := range entries {
		if e.IsDir() {
			runs["scripts/bench/"+e.Name()] = append(runs["scripts/bench/"+e.Name()], nil)
		}
	}
	for _, m := range runLine.FindAllStringSubmatch(string(data), -1) {
		h := m[1] + m[2]
		runs[h] = append(runs[h], strings.Fields(strings.NewReplacer(`"`, "", "'", "").Replace(m[3])))
	}
	covered := func(h string, args []string) bool {
		for _, ran := range runs[h] {
			if containsAll(ran, args) {
				return true
			}
		}
		return false
	}
	for _, r := range rows(t) {
		for _, re := range []*regexp.Regexp{goRunArgs, scriptArgs} {
			for _, m := range re.FindAllStringSubmatch(r.reproduce, -1) {
				args := strings.Fields(strings.NewReplacer(`"`, "", "'", "").Replace(m[2]))
				assert.Check(t, covered(m[1], args), "row %s: make bench (scripts/bench/run.sh) does not run %s %s", r.label, m[1], strings.Join(args, " "))
			}
		}
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
