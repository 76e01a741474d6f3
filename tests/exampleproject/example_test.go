package exampleproject

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/internal/testkit/docblocks"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
)

const docFile = "../../docs/standard-workers.md"

// wait bounds each wait for the project: a hang guard, not a timing.
const wait = 2 * time.Minute

// replaceOnce replaces old in s, failing when the page no longer has it.
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	assert.Assert(t, strings.Count(s, old) == 1, "%s no longer holds %q once: update this test with the page", docFile, old)
	return strings.Replace(s, old, new, 1)
}

type answer struct {
	status int
	body   string
}

func get(c *http.Client, method, url, body string) (answer, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b)}, err
}

// stats is GET /stats of the page's app.
type stats struct {
	Audit []struct {
		Event  string  `json:"event"`
		Key    string  `json:"key"`
		Status *string `json:"status"`
	} `json:"audit"`
	Ticks int `json:"ticks"`
}

// trailOf is one order's audit trail: "event status" in write order.
func trailOf(s stats, key string) []string {
	var out []string
	for _, e := range s.Audit {
		if e.Key != key {
			continue
		}
		st := "null"
		if e.Status != nil {
			st = *e.Status
		}
		out = append(out, e.Event+" "+st)
	}
	return out
}

// TestCompleteProject runs the page's project. Two things differ from
// the page, both for the test's sake: `npm install` is replaced by a
// link to the pinned iii-sdk 0.22.1 (offline), and the engine and the
// http listener take free ports instead of the defaults.
func TestCompleteProject(t *testing.T) {
	if testing.Short() {
		t.Skip("runs iii compose --up with five workers")
	}
	t.Parallel()
	doc, err := os.ReadFile(docFile)
	assert.NilError(t, err)
	section := string(doc)[strings.Index(string(doc), "## A complete project"):]
	files, steps, err := docblocks.Parse(docFile, section)
	assert.NilError(t, err)
	assert.DeepEqual(t, steps, []string{"(cd app && npm install)\niii compose --up\n"})
	for _, f := range []string{"worker-compose.yaml", "app/app.mjs", "app/package.json"} {
		assert.Assert(t, files[f] != "", "%s shows no %s", docFile, f)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	assert.NilError(t, json.Unmarshal([]byte(files["app/package.json"]), &pkg))
	assert.Check(t, is.Equal(pkg.Dependencies["iii-sdk"], "0.22.1"), "the page pins the SDK the test runs")

	sdk := nodesdk.Find(t)
	httpPort, err := loopback.FreePort()
	assert.NilError(t, err)
	project := map[string][]byte{
		"app/app.mjs":      []byte(files["app/app.mjs"]),
		"app/package.json": []byte(files["app/package.json"]),
		// What `npm install` would lay out: the package, here re-exporting
		// the pinned copy.
		"app/node_modules/iii-sdk/package.json": []byte(`{"name":"iii-sdk","version":"0.22.1","type":"module","exports":{".":"./index.mjs"}}`),
		"app/node_modules/iii-sdk/index.mjs":    []byte(fmt.Sprintf("export * from %q;\n", sdk.URL)),
	}
	compose := files["worker-compose.yaml"]
	compose = replaceOnce(t, compose, "http: { worker: package://http, version: '^0.22' }",
		fmt.Sprintf("http: { worker: package://http, version: '^0.22', config_override: { port: %d } }", httpPort))
	compose = replaceOnce(t, compose, "'node app.mjs'", fmt.Sprintf("'%s app.mjs'", sdk.Node))
	p := composeproj.Start(t, composeproj.Options{
		III:   iii,
		Files: project,
		Compose: func(port int) string {
			return fmt.Sprintf("engine:\n  url: ws://127.0.0.1:%d\n  workers: {}\n", port) + compose
		},
	})
	p.WaitReady(t, "state", "queue", "cron", "http", "app")

	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	c := &http.Client{Timeout: time.Minute}
	var a answer
	// The routes appear as the app's triggers reach the http worker.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if a, err = get(c, "POST", base+"/orders/7", `{"item":"book"}`); err != nil {
			return poll.Error(err)
		}
		if a.status == http.StatusNotFound {
			return poll.Continue("POST /orders/7: %d %s", a.status, a.body)
		}
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(200*time.Millisecond))
	assert.Check(t, is.Equal(a.status, http.StatusCreated), a.body)
	assert.Check(t, is.Equal(a.body, `{"id":"7","item":"book","status":"new"}`))

	// The durable subscriber fulfils it.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if a, err = get(c, "GET", base+"/orders/7", ""); err != nil {
			return poll.Error(err)
		}
		if a.body != `{"id":"7","item":"book","status":"fulfilled"}` {
			return poll.Continue("GET /orders/7: %d %s", a.status, a.body)
		}
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(200*time.Millisecond))
	assert.Check(t, is.Equal(a.status, http.StatusOK))
	a, err = get(c, "GET", base+"/orders/8", "")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(a.status, http.StatusNotFound), a.body)

	// The audit trail has both changes, in write order, and the clock runs.
	var first stats
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if a, err = get(c, "GET", base+"/stats", ""); err != nil {
			return poll.Error(err)
		}
		first = stats{}
		if err := json.Unmarshal([]byte(a.body), &first); err != nil {
			return poll.Error(fmt.Errorf("%v: %s", err, a.body))
		}
		if t7 := trailOf(first, "7"); len(t7) == 0 || t7[len(t7)-1] != "state:updated fulfilled" || first.Ticks < 1 {
			return poll.Continue("GET /stats: %s", a.body)
		}
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(200*time.Millisecond))
	assert.Check(t, is.Equal(trailOf(first, "7")[len(trailOf(first, "7"))-1], "state:updated fulfilled"), "%v", first)
	// The audit trigger may have been bound after order 7's first write
	// (each provider gets its triggers in its own time): order 9, placed
	// now, has its whole trail.
	a, err = get(c, "POST", base+"/orders/9", `{"item":"pen"}`)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(a.status, http.StatusCreated), a.body)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		var s stats
		if a, err = get(c, "GET", base+"/stats", ""); err != nil {
			return poll.Error(err)
		}
		if err := json.Unmarshal([]byte(a.body), &s); err != nil {
			return poll.Error(err)
		}
		if got := trailOf(s, "9"); len(got) < 2 {
			return poll.Continue("order 9's trail: %v", got)
		}
		assert.Check(t, is.DeepEqual(trailOf(s, "9"), []string{"state:created new", "state:updated fulfilled"}))
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(200*time.Millisecond))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		var s stats
		if a, err = get(c, "GET", base+"/stats", ""); err != nil {
			return poll.Error(err)
		}
		if err := json.Unmarshal([]byte(a.body), &s); err != nil {
			return poll.Error(err)
		}
		if s.Ticks < first.Ticks+2 {
			return poll.Continue("%d ticks, waiting for %d", s.Ticks, first.Ticks+2)
		}
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(200*time.Millisecond))
	p.Stop(t)
}
