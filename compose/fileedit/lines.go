package fileedit

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose/yamlbuild"
)

// Line-level edits compose::update makes: only the version line of a
// container changes, and a new dependency edge is appended to its
// start_after, so comments, quoting and every other line stay as written.

// SetVersion rewrites the value of containers.<key>.version in place,
// keeping its quoting style (and its trailing comment). A plain value is
// single-quoted when the new one would not read back as a string.
func (d *Doc) SetVersion(key, sel string) error {
	cn := d.Node(key)
	if cn == nil || cn.Kind != yaml.MappingNode || cn.Style&yaml.FlowStyle != 0 {
		return d.replaceField(key, "version", VersionNode(sel))
	}
	var vk, vv *yaml.Node
	for i := 0; i+1 < len(cn.Content); i += 2 {
		if cn.Content[i].Value == "version" {
			vk, vv = cn.Content[i], cn.Content[i+1]
		}
	}
	if vk == nil || vv.Kind != yaml.ScalarNode || vv.Line != vk.Line || vv.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return d.replaceField(key, "version", VersionNode(sel))
	}
	l := vv.Line - 1
	line := d.lines[l]
	start := vv.Column - 1
	if start > len(line) {
		return d.replaceField(key, "version", VersionNode(sel))
	}
	end := scalarEnd(line, start, vv.Style)
	if end < 0 {
		return d.replaceField(key, "version", VersionNode(sel))
	}
	d.lines[l] = line[:start] + renderVersion(sel, vv.Style) + line[end:]
	return nil
}

// scalarEnd finds where the Scalar token that starts at start ends on
// line; -1 when it cannot tell.
func scalarEnd(line string, start int, style yaml.Style) int {
	switch {
	case style&yaml.SingleQuotedStyle != 0:
		for i := start + 1; i < len(line); i++ {
			if line[i] == '\'' {
				if i+1 < len(line) && line[i+1] == '\'' {
					i++
					continue
				}
				return i + 1
			}
		}
		return -1
	case style&yaml.DoubleQuotedStyle != 0:
		for i := start + 1; i < len(line); i++ {
			switch line[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return -1
	default:
		end := len(line)
		if i := strings.Index(line[start:], " #"); i >= 0 {
			end = start + i
		}
		return start + len(strings.TrimRight(line[start:end], " \t"))
	}
}

func renderVersion(sel string, style yaml.Style) string {
	switch {
	case style&yaml.DoubleQuotedStyle != 0:
		return `"` + strings.ReplaceAll(strings.ReplaceAll(sel, `\`, `\\`), `"`, `\"`) + `"`
	case style&yaml.SingleQuotedStyle != 0:
		return "'" + strings.ReplaceAll(sel, "'", "''") + "'"
	}
	var v any
	if err := yaml.Unmarshal([]byte("v: "+sel), &v); err == nil {
		if m, ok := v.(map[string]any); ok {
			if s, ok := m["v"].(string); ok && s == sel {
				return sel
			}
		}
	}
	return "'" + strings.ReplaceAll(sel, "'", "''") + "'"
}

// replaceField is the fallback for a layout the line edits do not handle
// (a flow-style container, a version spread over lines): the container's
// block is rendered again with the field replaced.
func (d *Doc) replaceField(key, field string, val *yaml.Node) error {
	cn := d.Node(key)
	if cn == nil {
		return fmt.Errorf("containers.%s is not in %s", key, d.Path)
	}
	a := &Addition{Key: key, Fields: map[string]*yaml.Node{field: val}}
	return d.Upsert(key, a.Merged(cn))
}

// AddStartAfter appends deps (those not listed yet) to
// containers.<key>.start_after: into a one-line flow list, after the last
// item of a block list, or as a new `start_after: [..]` line after the
// worker: line.
func (d *Doc) AddStartAfter(key string, deps []string) error {
	cn := d.Node(key)
	if cn == nil || cn.Kind != yaml.MappingNode {
		return fmt.Errorf("containers.%s is not in %s", key, d.Path)
	}
	var sk, sv, wk *yaml.Node
	for i := 0; i+1 < len(cn.Content); i += 2 {
		switch cn.Content[i].Value {
		case "start_after":
			sk, sv = cn.Content[i], cn.Content[i+1]
		case "worker":
			wk = cn.Content[i]
		}
	}
	var missing []string
	for _, dep := range deps {
		listed := false
		if sv != nil {
			for _, it := range sv.Content {
				listed = listed || it.Value == dep
			}
		}
		if !listed && !contains(missing, dep) {
			missing = append(missing, dep)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	fallback := func() error {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle}
		if sv != nil {
			for _, it := range sv.Content {
				seq.Content = append(seq.Content, yamlbuild.Str(it.Value))
			}
		}
		for _, dep := range missing {
			seq.Content = append(seq.Content, yamlbuild.Str(dep))
		}
		return d.replaceField(key, "start_after", seq)
	}
	if cn.Style&yaml.FlowStyle != 0 || wk == nil {
		return fallback()
	}
	if sk == nil {
		l := wk.Line - 1
		if strings.Contains(d.lines[l], "{") {
			return fallback()
		}
		pad := strings.Repeat(" ", wk.Column-1)
		d.insert(l+1, []string{pad + "start_after: [" + strings.Join(missing, ", ") + "]"})
		return nil
	}
	switch {
	case sv.Kind == yaml.SequenceNode && sv.Style&yaml.FlowStyle != 0 && sv.Line == sk.Line:
		l := sv.Line - 1
		line := d.lines[l]
		closing := strings.LastIndex(line, "]")
		if closing < 0 {
			return fallback()
		}
		inner := strings.TrimSpace(line[sv.Column:closing])
		add := strings.Join(missing, ", ")
		if inner != "" {
			add = ", " + add
		}
		body := strings.TrimRight(line[:closing], " ")
		d.lines[l] = body + add + line[closing:]
		return nil
	case sv.Kind == yaml.SequenceNode && sv.Style&yaml.FlowStyle == 0 && len(sv.Content) > 0:
		last := sv.Content[len(sv.Content)-1]
		if last.Kind != yaml.ScalarNode {
			return fallback()
		}
		l := last.Line - 1
		dash := strings.Index(d.lines[l], "- ")
		if dash < 0 {
			return fallback()
		}
		pad := d.lines[l][:dash]
		var block []string
		for _, dep := range missing {
			block = append(block, pad+"- "+dep)
		}
		d.insert(l+1, block)
		return nil
	}
	return fallback()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// DropStartAfter removes gone from every container's start_after (the
// containers compose::update removes): an emptied list goes with its key.
func (d *Doc) DropStartAfter(gone []string) error {
	_, cv := d.containers()
	if cv == nil || cv.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(cv.Content); i += 2 {
		key := cv.Content[i].Value
		sv := yamlbuild.Child(cv.Content[i+1], "start_after")
		if sv == nil || sv.Kind != yaml.SequenceNode {
			continue
		}
		var keep []string
		hit := false
		for _, it := range sv.Content {
			if contains(gone, it.Value) {
				hit = true
				continue
			}
			keep = append(keep, it.Value)
		}
		if !hit {
			continue
		}
		if err := d.setStartAfter(key, keep); err != nil {
			return err
		}
		if err := d.Reparse(); err != nil {
			return err
		}
		_, cv = d.containers()
	}
	return nil
}

// setStartAfter replaces containers.<key>.start_after with list (none: the
// key goes): a one-line flow list is rewritten in place, a block list
// loses its lines; anything else is rendered again.
func (d *Doc) setStartAfter(key string, list []string) error {
	cn := d.Node(key)
	var sk, sv *yaml.Node
	for i := 0; cn != nil && i+1 < len(cn.Content); i += 2 {
		if cn.Content[i].Value == "start_after" {
			sk, sv = cn.Content[i], cn.Content[i+1]
		}
	}
	if sk == nil || cn.Style&yaml.FlowStyle != 0 {
		return d.rewriteContainer(key, list)
	}
	switch {
	case sv.Style&yaml.FlowStyle != 0 && sv.Line == sk.Line:
		l := sk.Line - 1
		if len(list) == 0 {
			d.replace(l, l+1, nil)
			return nil
		}
		line := d.lines[l]
		closing := strings.LastIndex(line, "]")
		if closing < 0 || sv.Column-1 > closing {
			return d.rewriteContainer(key, list)
		}
		d.lines[l] = line[:sv.Column-1] + "[" + strings.Join(list, ", ") + line[closing:]
		return nil
	case sv.Style&yaml.FlowStyle == 0:
		var drop []int
		for _, it := range sv.Content {
			if !contains(list, it.Value) {
				drop = append(drop, it.Line-1)
			}
		}
		if len(list) == 0 {
			drop = append(drop, sk.Line-1)
		}
		slices.Sort(drop)
		for i := len(drop) - 1; i >= 0; i-- {
			d.replace(drop[i], drop[i]+1, nil)
		}
		return nil
	}
	return d.rewriteContainer(key, list)
}

// rewriteContainer renders a container again with start_after = list.
func (d *Doc) rewriteContainer(key string, list []string) error {
	cn := d.Node(key)
	if cn == nil {
		return fmt.Errorf("containers.%s is not in %s", key, d.Path)
	}
	out := yamlbuild.Map()
	for i := 0; i+1 < len(cn.Content); i += 2 {
		if cn.Content[i].Value == "start_after" {
			if len(list) > 0 {
				out.Content = append(out.Content, cn.Content[i], FlowList(list))
			}
			continue
		}
		out.Content = append(out.Content, cn.Content[i], cn.Content[i+1])
	}
	return d.Upsert(key, out)
}
