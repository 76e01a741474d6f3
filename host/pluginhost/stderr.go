package pluginhost

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"unicode/utf8"
)

// tailLines is how many of an adapter's last stderr lines are kept to
// explain a failed start.
const (
	tailLines    = 16
	tailLineSize = 2048
)

// stderrTail keeps the last lines an adapter wrote to stderr. go-plugin
// copies every raw line (with its newline) here as well as into the
// engine's log; when the adapter dies before it can answer, these lines
// are the only account of why.
type stderrTail struct {
	mu    sync.Mutex
	lines []string
	part  []byte
}

func (t *stderrTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(t.part) < tailLineSize {
				t.part = append(t.part, p[:min(len(p), tailLineSize-len(t.part))]...)
			}
			break
		}
		if len(t.part) < tailLineSize {
			t.part = append(t.part, p[:min(i, tailLineSize-len(t.part))]...)
		}
		t.push(string(t.part))
		t.part = t.part[:0]
		p = p[i+1:]
	}
	return n, nil
}

func (t *stderrTail) push(line string) {
	line = strings.TrimSpace(strings.ToValidUTF8(line, "\uFFFD"))
	if line == "" {
		return
	}
	t.lines = append(t.lines, line)
	if len(t.lines) > tailLines {
		t.lines = t.lines[len(t.lines)-tailLines:]
	}
}

// lastError is the adapter's own account of its last failure: the message
// of the last error-level hclog JSON line (with its error or reason field),
// else the last line as written; "" when it wrote nothing.
func (t *stderrTail) lastError() string {
	t.mu.Lock()
	lines := append([]string(nil), t.lines...)
	if len(t.part) > 0 {
		lines = append(lines, strings.TrimSpace(strings.ToValidUTF8(string(t.part), "\uFFFD")))
	}
	t.mu.Unlock()
	for i := len(lines) - 1; i >= 0; i-- {
		if msg, ok := errorLine(lines[i]); ok {
			return msg
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i] != "" {
			return clip(lines[i], 500)
		}
	}
	return ""
}

// errorLine reads an hclog JSON line of level error (or worse).
func errorLine(line string) (string, bool) {
	if !strings.HasPrefix(line, "{") {
		return "", false
	}
	var entry map[string]any
	if json.Unmarshal([]byte(line), &entry) != nil {
		return "", false
	}
	level, _ := entry["@level"].(string)
	if level != "error" && level != "fatal" {
		return "", false
	}
	msg, _ := entry["@message"].(string)
	for _, k := range []string{"error", "reason"} {
		if v, ok := entry[k].(string); ok && v != "" {
			msg += ": " + v
			break
		}
	}
	if msg == "" {
		return "", false
	}
	return clip(msg, 500), true
}

// clip shortens s to at most n bytes without splitting a character.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
