package server

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/protocol"
)

// The 0.26 guide's workers: list, with both optional engine workers and
// their upstream keys, starts unchanged; one reload removes both, the next
// adds both back.
func TestConfig026WithBothEngineWorkers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	wmPort, streamPort := freePort(t), freePort(t)
	env := engineEnv(t, "STREAM_PORT", strconv.Itoa(streamPort))
	base := "registration_namespace_grace_ms: 5000\n" + listenerConfig(wmPort) +
		"  - name: configuration\n    config:\n      adapter: { name: fs, config: { directory: ./config } }\n"
	both := base + "  - name: iii-http-functions\n    config:\n      security: { url_allowlist: ['*'], block_private_ips: true, require_https: true }\n" +
		"  - name: iii-stream                       # deprecated, still accepted\n    config: { port: ${STREAM_PORT:3112}, host: 127.0.0.1 }\n"
	writeConfig(t, path, both)
	r := serveWith(t, path, env, hclog.NewNullLogger())
	assert.Equal(t, r.s.StreamAddr(), "127.0.0.1:"+strconv.Itoa(streamPort))
	assert.Assert(t, r.s.Engine().HTTPFunctions() != nil)
	w := dial(t, "127.0.0.1:"+strconv.Itoa(wmPort))
	_, errb := w.call(t, "stream::set", `{"stream_name":"s","group_id":"g","item_id":"i","data":1}`)
	assert.Assert(t, errb == nil, "%+v", errb)

	running := func(want bool) {
		t.Helper()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			stream, http := r.s.StreamAddr() != "", r.s.Engine().HTTPFunctions() != nil
			if stream != want || http != want {
				return poll.Continue("stream running %v, http functions running %v", stream, http)
			}
			return poll.Success()
		}, poll.WithTimeout(20*time.Second))
	}
	writeConfig(t, path, base)
	running(false)
	_, errb = w.call(t, "stream::get", `{"stream_name":"s","group_id":"g","item_id":"i"}`)
	assert.Assert(t, errb != nil && errb.Code == protocol.CodeFunctionNotFound, "%+v", errb)

	writeConfig(t, path, both)
	running(true)
	out, errb := w.call(t, "stream::get", `{"stream_name":"s","group_id":"g","item_id":"i"}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, string(out), "1")
	assert.Equal(t, r.s.StreamAddr(), "127.0.0.1:"+strconv.Itoa(streamPort))
}
