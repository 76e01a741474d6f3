package config

import "strings"

// StripWorkerConfig removes the config: block of the workers: entry named
// workerName from a config.yaml's text and puts comment in its place,
// keeping the entry itself and every other byte of the file: comments,
// key order and ${VAR:default} placeholders, which a YAML round trip
// would lose. It handles the block form
//
//   - name: iii-stream
//     config: …            (inline or nested lines below)
//
// and reports false, changing nothing, for anything else (no such entry,
// no config: key, a flow-style entry).
func StripWorkerConfig(content []byte, workerName, comment string) ([]byte, bool) {
	lines := strings.Split(string(content), "\n")
	indent := func(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }
	blank := func(l string) bool { t := strings.TrimSpace(l); return t == "" || strings.HasPrefix(t, "#") }

	// The entry is an item of the top-level workers: list, at that list's
	// indent (a nested list may hold a name: too).
	from, itemIndent := -1, -1
	for i, l := range lines {
		if strings.HasPrefix(l, "workers:") {
			from = i + 1
			break
		}
	}
	if from < 0 {
		return content, false
	}
	entry, keyIndent := -1, 0
	for i := from; i < len(lines); i++ {
		l := lines[i]
		if blank(l) {
			continue
		}
		if indent(l) == 0 && !strings.HasPrefix(l, "-") {
			break // the next top-level key: the list ended
		}
		if itemIndent < 0 {
			itemIndent = indent(l)
		}
		if indent(l) != itemIndent {
			continue
		}
		rest, ok := strings.CutPrefix(strings.TrimLeft(l, " "), "-")
		if !ok || !strings.HasPrefix(rest, " ") {
			continue
		}
		key := strings.TrimLeft(rest, " ")
		value, ok := strings.CutPrefix(key, "name:")
		if !ok {
			continue
		}
		if v, _, _ := strings.Cut(value, "#"); strings.Trim(strings.TrimSpace(v), `"'`) == workerName {
			entry, keyIndent = i, len(l)-len(key)
			break
		}
	}
	if entry < 0 {
		return content, false
	}
	start := -1
	for i := entry + 1; i < len(lines); i++ {
		l := lines[i]
		if blank(l) {
			continue
		}
		if indent(l) < keyIndent {
			break // the entry ended without a config: key
		}
		if indent(l) == keyIndent && (strings.HasPrefix(l[keyIndent:], "config:")) {
			start = i
			break
		}
	}
	if start < 0 {
		return content, false
	}
	end := start // the block's last line: deeper lines follow the key
	for i := start + 1; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) == "" {
			continue
		}
		if indent(lines[i]) <= keyIndent {
			break
		}
		end = i
	}
	out := make([]string, 0, len(lines))
	out = append(out, lines[:start]...)
	out = append(out, strings.Repeat(" ", keyIndent)+comment)
	out = append(out, lines[end+1:]...)
	return []byte(strings.Join(out, "\n")), true
}
