package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
)

// templates is adapter::info's snapshot_templates.templates: "<slot>/<id>"
// for every saved template.
func templates(t *testing.T, p *proc) []string {
	t.Helper()
	st, _ := p.info(t)["snapshot_templates"].(map[string]any)
	var out []string
	list, _ := st["templates"].([]any)
	for _, v := range list {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}

// waitTemplate waits until a template of slot prefix exists and returns it.
func waitTemplate(t *testing.T, p *proc, prefix string, not ...string) string {
	t.Helper()
	var got string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, tpl := range templates(t, p) {
			if strings.HasPrefix(tpl, prefix) && !is.Contains(not, tpl)().Success() {
				got = tpl
				return poll.Success()
			}
		}
		return poll.Continue("no %s template yet: %v", prefix, templates(t, p))
	}, poll.WithTimeout(3*time.Minute), poll.WithDelay(100*time.Millisecond))
	return got
}

// readyLine is the adapter's "sandbox VM ready" log line for sandbox id
// (it names the pooled VM a create claimed, and whether the VM was restored
// from a template). The log arrives asynchronously, so it waits for it.
func readyLine(t *testing.T, p *proc, id string) string {
	t.Helper()
	var line string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, l := range strings.Split(p.logs.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "{") && strings.Contains(l, "sandbox VM ready") && strings.Contains(l, id) {
				line = l
				return poll.Success()
			}
		}
		return poll.Continue("no \"sandbox VM ready\" line for %s yet", id)
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))
	return line
}

// freshness reads 16 bytes of the guest's /dev/urandom and checks that the
// guest's clock is within a second of the host's.
func freshness(t *testing.T, p *proc, id string) string {
	t.Helper()
	before := time.Now()
	out := p.sh(t, id, "date +%s.%N; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; cat /proc/sys/kernel/hostname")
	after := time.Now()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Assert(t, is.Len(lines, 3), out)
	guest, err := strconv.ParseFloat(lines[0], 64)
	assert.NilError(t, err)
	guestT := time.Unix(0, int64(guest*1e9))
	assert.Check(t, guestT.After(before.Add(-time.Second)) && guestT.Before(after.Add(time.Second)),
		"guest clock %s, host %s..%s", guestT, before, after)
	assert.Check(t, is.Len(lines[1], 32), out)
	assert.Check(t, is.Equal(lines[2], "sandbox-"+id[:8]), "the guest's host name is its own")
	return lines[1]
}

// TestSnapshotTemplates: the first boot of an image and shape records a
// template in the background; later creates restore from it (and the warm
// pool refills from it); pooled and restored sandboxes each have their own
// randomness, the host's clock, their own host name and none of an earlier
// sandbox's files; a changed image digest records a new template and
// deletes the old one.
func TestSnapshotTemplates(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	state := dirs.Short(t, "sb")
	cfg := map[string]any{
		"warm_pool":       map[string]any{"python": 1},
		"custom_images":   map[string]any{"tpl": pythonRef},
		"image_allowlist": []any{"python", "tpl"},
	}
	p := start(t, e, state, cfg)
	waitPoolReady(t, p, "python", 1)
	waitTemplate(t, p, "python-")

	seen := map[string]string{}
	fresh := func(id string) {
		v := freshness(t, p, id)
		assert.Check(t, seen[v] == "", "sandboxes %s and %s read the same 16 bytes of /dev/urandom", seen[v], id)
		seen[v] = id
		assert.Check(t, is.Equal(p.sh(t, id, "ls /root/marker-* 2>/dev/null; true"), ""), "a file of an earlier sandbox")
		p.sh(t, id, "echo x > /root/marker-"+id[:8])
	}

	// Five from the pool; its refills restore from the template.
	for range 5 {
		waitPoolReady(t, p, "python", 1)
		id := p.create(t, nil)
		assert.Assert(t, claimed(t, p, id))
		fresh(id)
		p.stop(t, id)
	}
	assert.Check(t, strings.Contains(p.logs.String(), `"warm pool VM ready"`) && strings.Contains(p.logs.String(), `"restored":true`),
		"no warm pool refill was restored from the template")

	// Another image name is another template: its first create boots
	// cold, the next five restore.
	first := p.create(t, map[string]any{"image": "tpl"})
	assert.Check(t, strings.Contains(readyLine(t, p, first), `"restored":false`))
	p.stop(t, first)
	old := waitTemplate(t, p, "tpl-")
	for range 5 {
		id := p.create(t, map[string]any{"image": "tpl"})
		line := readyLine(t, p, id)
		assert.Check(t, strings.Contains(line, `"restored":true`) && strings.Contains(line, `"pooled":""`), line)
		fresh(id)
		p.stop(t, id)
	}
	assert.Equal(t, len(seen), 10)

	// The adapter's stop leaves the templates, and nothing running.
	p.client.Kill()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if left := procsUnder(state); len(left) > 0 {
			return poll.Continue("processes %v", left)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))
	assert.Check(t, is.Len(sandboxDirs(t, state), 0))

	// The same name now means another image (another digest): the next
	// create boots cold and records a new template, which replaces the
	// old one; the one after restores from it, and it is the new image.
	cfg["custom_images"] = map[string]any{"tpl": nodeRef}
	delete(cfg, "warm_pool")
	p = start(t, e, state, cfg)
	id := p.create(t, map[string]any{"image": "tpl"})
	assert.Check(t, strings.Contains(readyLine(t, p, id), `"restored":false`))
	p.stop(t, id)
	renewed := waitTemplate(t, p, "tpl-", old)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := os.Stat(filepath.Join(state, "templates", old)); err == nil {
			return poll.Continue("the old template %s is still there", old)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second))
	assert.Check(t, is.Contains(templates(t, p), renewed))
	id = p.create(t, map[string]any{"image": "tpl"})
	assert.Check(t, strings.Contains(readyLine(t, p, id), `"restored":true`))
	assert.Check(t, strings.HasPrefix(p.sh(t, id, "node --version"), "v"))
	p.stop(t, id)
}
