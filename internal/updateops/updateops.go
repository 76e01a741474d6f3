// Package updateops is the one implementation of the update operations that
// the engine's iii-stream worker (stream::update) and the registry state
// worker (state::update) share, as upstream's two workers share one helper:
// set, merge, increment, decrement, append and remove, each applied in order,
// a failing one recorded as an OpError and skipped. It has no dependency on
// the engine, so the state worker's binary does not link it.
package updateops

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// The bounds of one update operation's path and merge value (upstream's).
const (
	maxPathDepth   = 32
	maxSegment     = 256
	maxMergeDepth  = 16
	maxMergeKeys   = 1024
	maxOpsPerBatch = 256
)

// protoKeys are refused as path segments and merge keys: a JavaScript
// client that merges the value into an object would pollute its prototype.
var protoKeys = []string{"__proto__", "constructor", "prototype"}

// Op is one operation of stream::update and state::update, as iii's SDKs
// send it (upstream's shared helper type iii_helpers::stream::Op):
// {"type":"set","path":"a","value":1}, {"type":"merge","path":["a","b"],
// "value":{…}}, {"type":"increment","path":"n","by":2}, "decrement",
// "append" and "remove".
type Op struct {
	Type  string
	Path  []string // nil/empty: the root
	Value any      // set, merge, append
	By    int64    // increment, decrement
}

// OpError reports an operation that was skipped (the others still apply).
type OpError struct {
	OpIndex int    `json:"op_index"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Decode reads the ops array of an update. An unknown type, a missing
// field or too many operations refuses the whole call, as upstream's serde
// decoding does.
func Decode(raw json.RawMessage) ([]Op, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		return nil, fmt.Errorf("ops must be an array of update operations")
	}
	if len(items) > maxOpsPerBatch {
		return nil, fmt.Errorf("ops has %d operations; at most %d are allowed in one update", len(items), maxOpsPerBatch)
	}
	ops := make([]Op, 0, len(items))
	for i, it := range items {
		var o struct {
			Type  *string         `json:"type"`
			Path  json.RawMessage `json:"path"`
			Value json.RawMessage `json:"value"`
			By    json.RawMessage `json:"by"`
		}
		if err := json.Unmarshal(it, &o); err != nil || o.Type == nil {
			return nil, fmt.Errorf("ops[%d] must be an object with a type", i)
		}
		op := Op{Type: *o.Type}
		switch op.Type {
		case "set", "increment", "decrement", "remove":
			var p *string
			if err := json.Unmarshal(orNull(o.Path), &p); err != nil || p == nil {
				return nil, fmt.Errorf("ops[%d] (%s) needs path, a string (\"\" is the root)", i, op.Type)
			}
			if *p != "" {
				op.Path = []string{*p}
			}
		case "merge", "append":
			path, ok := mergePath(o.Path)
			if !ok {
				return nil, fmt.Errorf("ops[%d] (%s): path must be a string or an array of strings", i, op.Type)
			}
			op.Path = path
		default:
			return nil, fmt.Errorf("ops[%d]: unknown type %q; use set, merge, increment, decrement, append or remove", i, op.Type)
		}
		switch op.Type {
		case "set", "merge", "append":
			if op.Type != "set" && o.Value == nil {
				return nil, fmt.Errorf("ops[%d] (%s) needs value", i, op.Type)
			}
			v, err := DecodeValue(orNull(o.Value))
			if err != nil {
				return nil, fmt.Errorf("ops[%d].value: %v", i, err)
			}
			op.Value = v
		case "increment", "decrement":
			if err := json.Unmarshal(orNull(o.By), &op.By); err != nil || o.By == nil || bytes.Equal(o.By, []byte("null")) {
				return nil, fmt.Errorf("ops[%d] (%s) needs by, a whole number", i, op.Type)
			}
		}
		ops = append(ops, op)
	}
	return ops, nil
}

func orNull(b json.RawMessage) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return b
}

// mergePath reads a merge/append path: absent, null, "" (the root), a
// string (one segment) or an array of strings.
func mergePath(raw json.RawMessage) ([]string, bool) {
	if raw == nil || bytes.Equal(raw, []byte("null")) {
		return nil, true
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return nil, true
		}
		return []string{s}, true
	}
	var segs []string
	if err := json.Unmarshal(raw, &segs); err == nil {
		return segs, true
	}
	return nil, false
}

// DecodeValue decodes JSON keeping numbers exact (json.Number).
func DecodeValue(raw json.RawMessage) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

func pathLabel(p []string) string {
	switch len(p) {
	case 0:
		return "root"
	case 1:
		return p[0]
	}
	return fmt.Sprint(p)
}

func checkPath(op string, i int, p []string) *OpError {
	if len(p) > maxPathDepth {
		return &OpError{i, op + ".path.too_deep", fmt.Sprintf("Path depth %d exceeds maximum of %d", len(p), maxPathDepth)}
	}
	for _, s := range p {
		switch {
		case s == "":
			return &OpError{i, op + ".path.empty_segment", "Path contains an empty segment"}
		case len(s) > maxSegment:
			return &OpError{i, op + ".path.segment_too_long", fmt.Sprintf("Path segment of %d bytes exceeds maximum of %d", len(s), maxSegment)}
		case slices.Contains(protoKeys, s):
			return &OpError{i, op + ".path.proto_polluted", fmt.Sprintf("Path segment '%s' is not allowed (prototype pollution).", s)}
		}
	}
	return nil
}

func depth(v any) int {
	switch t := v.(type) {
	case map[string]any:
		d := 0
		for _, c := range t {
			d = max(d, depth(c))
		}
		return d + 1
	case []any:
		d := 0
		for _, c := range t {
			d = max(d, depth(c))
		}
		return d + 1
	}
	return 0
}

// addNumber adds by to n, exactly for integers; ok is false when n is not
// a number or the sum overflows.
func addNumber(n any, by int64) (json.Number, bool) {
	num, isNum := n.(json.Number)
	if !isNum {
		return "", false
	}
	i, err := strconv.ParseInt(string(num), 10, 64)
	if err == nil {
		if s := i + by; (by >= 0) == (s >= i) {
			return json.Number(strconv.FormatInt(s, 10)), true
		}
	}
	if u, uerr := strconv.ParseUint(string(num), 10, 64); uerr == nil {
		// Past int64 (or a sum leaving it), as upstream: unsigned, checked.
		if by >= 0 {
			if s := u + uint64(by); s >= u {
				return json.Number(strconv.FormatUint(s, 10)), true
			}
		} else if d := uint64(-(by + 1)) + 1; d <= u {
			return json.Number(strconv.FormatUint(u-d, 10)), true
		}
		return "", false
	}
	if err == nil {
		return "", false // an int64 that over- or underflows
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil {
		return "", false
	}
	r := f + float64(by)
	if math.IsInf(r, 0) || math.IsNaN(r) {
		return "", false
	}
	return json.Number(strconv.FormatFloat(r, 'g', -1, 64)), true
}

func negate(by int64) int64 {
	if by == math.MinInt64 {
		return by
	}
	return -by
}

// walk returns the object at path under root, turning whatever is in the
// way into objects (merge and append create their path).
func walk(root *any, path []string) map[string]any {
	if _, ok := (*root).(map[string]any); !ok {
		*root = map[string]any{}
	}
	node := (*root).(map[string]any)
	for _, s := range path {
		next, ok := node[s].(map[string]any)
		if !ok {
			next = map[string]any{}
			node[s] = next
		}
		node = next
	}
	return node
}

// appendTo appends v to target (an array, a string, or null/missing).
func appendTo(target any, v any) (any, bool) {
	switch t := target.(type) {
	case []any:
		return append(t, v), true
	case string:
		s, ok := v.(string)
		if !ok {
			return target, false
		}
		return t + s, true
	case nil:
		return initialAppend(v), true
	}
	return target, false
}

func initialAppend(v any) any {
	if s, ok := v.(string); ok {
		return s
	}
	return []any{v}
}

// applyOps applies ops to old (nil: the item does not exist) the way
// upstream's engine does: an operation that cannot apply is skipped and
// reported; the others still apply.
func Apply(old any, exists bool, ops []Op) (any, []OpError) {
	missing := !exists
	cur := old
	if !exists {
		cur = map[string]any{}
	}
	var errs []OpError
	fail := func(e *OpError) { errs = append(errs, *e) }
	for i, op := range ops {
		if e := checkPath(op.Type, i, op.Path); e != nil {
			fail(e)
			continue
		}
		switch op.Type {
		case "set":
			if len(op.Path) == 0 {
				cur, missing = op.Value, false
			} else if m, ok := cur.(map[string]any); ok {
				m[op.Path[0]], missing = op.Value, false
			} else {
				fail(&OpError{i, "set.target_not_object", fmt.Sprintf("Cannot set at path '%s': target is %s, expected object.", pathLabel(op.Path), typeName(cur))})
			}
		case "merge":
			m, ok := op.Value.(map[string]any)
			switch {
			case !ok:
				fail(&OpError{i, "merge.value.not_an_object", "Merge value must be a JSON object"})
				continue
			case len(m) > maxMergeKeys:
				fail(&OpError{i, "merge.value.too_many_keys", fmt.Sprintf("Merge value has %d top-level keys, exceeds maximum of %d", len(m), maxMergeKeys)})
				continue
			case depth(op.Value) > maxMergeDepth:
				fail(&OpError{i, "merge.value.too_deep", fmt.Sprintf("Merge value JSON nesting depth %d exceeds maximum of %d", depth(op.Value), maxMergeDepth)})
				continue
			}
			if k := protoKey(m); k != "" {
				fail(&OpError{i, "merge.value.proto_polluted", fmt.Sprintf("Merge value top-level key %q is a prototype-pollution sink", k)})
				continue
			}
			if len(op.Path) == 0 {
				target, ok := cur.(map[string]any)
				if !ok {
					continue // upstream: logged, not reported
				}
				for k, v := range m {
					target[k] = v
				}
			} else {
				target := walk(&cur, op.Path)
				for k, v := range m {
					target[k] = v
				}
			}
			missing = false
		case "increment", "decrement":
			by := op.By
			if op.Type == "decrement" {
				by = negate(op.By)
			}
			if len(op.Path) == 0 {
				if missing {
					cur = json.Number(strconv.FormatInt(by, 10))
				} else if n, ok := addNumber(cur, by); ok {
					cur = n
				} else {
					fail(&OpError{i, op.Type + ".not_number", fmt.Sprintf("Expected number at path 'root', got %s.", typeName(cur))})
					continue
				}
				missing = false
			} else if m, ok := cur.(map[string]any); ok {
				k := op.Path[0]
				if v, has := m[k]; has {
					n, ok := addNumber(v, by)
					if !ok {
						fail(&OpError{i, op.Type + ".not_number", fmt.Sprintf("Expected number at path '%s', got %s.", k, typeName(v))})
						continue
					}
					m[k] = n
				} else {
					m[k] = json.Number(strconv.FormatInt(by, 10))
				}
				missing = false
			} else {
				fail(&OpError{i, op.Type + ".target_not_object", fmt.Sprintf("Cannot %s at path '%s': target is %s, expected object.", op.Type, pathLabel(op.Path), typeName(cur))})
			}
		case "append":
			if len(op.Path) == 0 {
				if missing {
					cur = nil
				}
				next, ok := appendTo(cur, op.Value)
				if !ok {
					fail(&OpError{i, "append.type_mismatch", fmt.Sprintf("Cannot append at path 'root': target is %s, value is %s.", typeName(cur), typeName(op.Value))})
					continue
				}
				cur, missing = next, false
				continue
			}
			if _, ok := cur.(map[string]any); !ok {
				fail(&OpError{i, "append.target_not_object", fmt.Sprintf("Cannot append at path '%s': target is %s, expected object.", pathLabel(op.Path), typeName(cur))})
				continue
			}
			parent := walk(&cur, op.Path[:len(op.Path)-1])
			leaf := op.Path[len(op.Path)-1]
			if v, has := parent[leaf]; has {
				next, ok := appendTo(v, op.Value)
				if !ok {
					fail(&OpError{i, "append.type_mismatch", fmt.Sprintf("Cannot append at path '%s': target is %s, value is %s.", leaf, typeName(v), typeName(op.Value))})
					continue
				}
				parent[leaf] = next
			} else if len(op.Path) == 1 {
				parent[leaf] = initialAppend(op.Value)
			} else {
				parent[leaf] = []any{op.Value}
			}
			missing = false
		case "remove":
			if len(op.Path) == 0 {
				cur, missing = nil, false
			} else if m, ok := cur.(map[string]any); ok {
				delete(m, op.Path[0])
				missing = false
			} else {
				fail(&OpError{i, "remove.target_not_object", fmt.Sprintf("Cannot remove at path '%s': target is %s, expected object.", pathLabel(op.Path), typeName(cur))})
			}
		}
	}
	return cur, errs
}

func protoKey(m map[string]any) string {
	for _, k := range protoKeys {
		if _, ok := m[k]; ok {
			return k
		}
	}
	return ""
}
