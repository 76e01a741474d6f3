// Package docblocks reads the marked blocks of a documentation page, so a
// test can write the files a page shows and run its steps as written (the
// page cannot rot): a line `<!-- file: path -->` or `<!-- run: name -->`
// directly followed by a fenced block.
package docblocks

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	fileMarker = regexp.MustCompile(`^<!-- file: (\S+) -->$`)
	runMarker  = regexp.MustCompile(`^<!-- run: (\S+) -->$`)
)

// Parse returns the page's marked blocks: files by path, and run steps in
// order. name labels errors.
func Parse(name, doc string) (files map[string]string, steps []string, err error) {
	files = map[string]string{}
	lines := strings.Split(doc, "\n")
	for i, l := range lines {
		f, r := fileMarker.FindStringSubmatch(l), runMarker.FindStringSubmatch(l)
		if f == nil && r == nil {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, nil, fmt.Errorf("%s:%d: a marker must be followed by a fenced block", name, i+1)
		}
		var body []string
		closed := false
		for _, b := range lines[i+2:] {
			if b == "```" {
				closed = true
				break
			}
			body = append(body, b)
		}
		if !closed {
			return nil, nil, fmt.Errorf("%s:%d: the block is not closed", name, i+1)
		}
		text := strings.Join(body, "\n") + "\n"
		if f != nil {
			if _, dup := files[f[1]]; dup {
				return nil, nil, fmt.Errorf("%s:%d: file %s is shown twice", name, i+1, f[1])
			}
			files[f[1]] = text
		} else {
			steps = append(steps, text)
		}
	}
	return files, steps, nil
}
