package sdk

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/procstats"
)

func TestWithRuntime(t *testing.T) {
	s := procstats.Stats{Goroutines: 9, OpenFDs: 14, RSSBytes: 1 << 20}
	block := map[string]any{"goroutines": 9, "open_fds": 14, "rss_bytes": int64(1 << 20)}
	cases := []struct {
		name  string
		facts map[string]any
		want  map[string]any
	}{
		{"no facts", nil, map[string]any{"runtime": block}},
		{"facts kept", map[string]any{"accel": "tcg", "warm_pool": map[string]any{}},
			map[string]any{"accel": "tcg", "warm_pool": map[string]any{}, "runtime": block}},
		{"the adapter's own runtime fact is replaced", map[string]any{"runtime": "mine"}, map[string]any{"runtime": block}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before map[string]any
			if tc.facts != nil {
				b, _ := json.Marshal(tc.facts)
				assert.NilError(t, json.Unmarshal(b, &before))
			}
			got := withRuntime(tc.facts, s)
			assert.DeepEqual(t, got, tc.want)
			if tc.facts != nil {
				after := map[string]any{}
				b, _ := json.Marshal(tc.facts)
				assert.NilError(t, json.Unmarshal(b, &after))
				assert.DeepEqual(t, after, before) // the adapter's map is not written to
			}
		})
	}
}

// infoOnly is an adapter whose Info returns one shared value.
type infoOnly struct {
	contract.Adapter
	info *contract.AdapterInfo
}

func (a infoOnly) Info(context.Context) (*contract.AdapterInfo, error) { return a.info, nil }

func TestServedInfoHasRuntime(t *testing.T) {
	shared := &contract.AdapterInfo{Facts: map[string]any{"pid": 1}}
	a := newServedAdapter(infoOnly{info: shared}, ServeConfig{Name: "x", Version: "1.0.0"}, hclog.NewNullLogger(), nil)
	info, err := a.Info(context.Background())
	assert.NilError(t, err)
	assert.Equal(t, info.Adapter, "x")
	assert.Check(t, is.Len(shared.Facts, 1), "the adapter's own facts are not changed")

	// Over the wire: adapter::info's JSON has the block, with this
	// process's figures.
	raw, err := json.Marshal(info)
	assert.NilError(t, err)
	var out struct {
		PID     int             `json:"pid"`
		Runtime procstats.Stats `json:"runtime"`
	}
	assert.NilError(t, json.Unmarshal(raw, &out))
	assert.Equal(t, out.PID, 1)
	assert.Check(t, out.Runtime.Goroutines >= 1, "%s", raw)
	assert.Check(t, out.Runtime.RSSBytes > 0, "%s", raw)
	assert.Check(t, out.Runtime.OpenFDs > 0, "%s", raw)

	// The process's instance id: the same on every call of one adapter,
	// another for another process (here: another served adapter).
	var ids struct {
		Instance string `json:"instance_id"`
	}
	assert.NilError(t, json.Unmarshal(raw, &ids))
	assert.Check(t, is.Len(ids.Instance, 32), "%s", raw)
	again, err := a.Info(context.Background())
	assert.NilError(t, err)
	assert.Check(t, is.Equal(again.Facts[InstanceFactKey], ids.Instance))
	other, err := newServedAdapter(infoOnly{info: shared}, ServeConfig{Name: "x"}, hclog.NewNullLogger(), nil).Info(context.Background())
	assert.NilError(t, err)
	assert.Check(t, other.Facts[InstanceFactKey] != ids.Instance)
}
