package engine

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
)

// A 0.25/0.26 SDK's observer frames meet an engine without observers: the
// greeting lists no protocol features (so the SDK fails observe with
// UNSUPPORTED, as upstream documents for such an engine), a frame type
// the engine does not speak is logged once per connection with the way
// out, nothing is answered in a form the engine would have to invent, and
// the connection goes on serving its calls.
func TestObserverFramesAreUnsupported(t *testing.T) {
	logs := &syncbuf.Buffer{}
	te := startEngine(t, Options{Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn})})

	rc := te.dial(t)
	rc.registerIn("", "sdk-0-26", "app::target")
	for range 3 {
		rc.sendRaw(`{"type":"observe","id":"o1","source":{"function_id":"app::target"},"target":"app::target"}`)
	}
	rc.sendRaw(`{"type":"unobserve","id":"o1"}`)
	rc.sendRaw(`{"type":"` + strings.Repeat("x", 4096) + `"}`)
	rc.sync() // nothing was answered in between, and the socket is up

	text := logs.String()
	assert.Check(t, is.Equal(strings.Count(text, "observers (iii 0.25+) are not supported"), 1), text)
	assert.Check(t, is.Contains(text, "code=UNSUPPORTED"))
	assert.Check(t, is.Contains(text, "docs/upgrading-to-0.26.md"))
	assert.Check(t, len(text) < 2048, "a frame type is logged bounded:\n%s", text)

	// Another connection gets its own warning; this one's calls still work.
	other := te.dial(t)
	other.sendRaw(`{"type":"observe","id":"o2"}`)
	other.sync()
	assert.Check(t, is.Equal(strings.Count(logs.String(), "observers (iii 0.25+) are not supported"), 2))
	go rc.serveEcho()
	f := other.call("c1", "app::target", nil, `{"n":1}`)
	assert.Check(t, f["error"] == nil, "%v", f)
}

// The greeting carries no features: this engine negotiates none of 0.25+'s
// protocol features (observe.capture among them).
func TestGreetingListsNoFeatures(t *testing.T) {
	te := startEngine(t, Options{})
	rc := te.dial(t)
	_, has := rc.hello["features"]
	assert.Check(t, !has, "%v", rc.hello)
}
