package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

func TestProgressField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, schema, want string
	}{
		{"marked", `{"type":"object","properties":{"image":{"type":"string"},"progress":{"type":"object","x-iii-progress":true}}}`, "progress"},
		{"another name", `{"properties":{"watch":{"x-iii-progress":true}}}`, "watch"},
		{"not marked", `{"properties":{"progress":{"type":"object"}}}`, ""},
		{"marked false", `{"properties":{"progress":{"x-iii-progress":false}}}`, ""},
		{"marked with a string", `{"properties":{"progress":{"x-iii-progress":"true"}}}`, ""},
		{"two marked", `{"properties":{"a":{"x-iii-progress":true},"b":{"x-iii-progress":true}}}`, ""},
		{"a property that is not an object", `{"properties":{"progress":true}}`, ""},
		{"no schema", ``, ""},
		{"null", `null`, ""},
		{"not an object", `[1]`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, progressField(json.RawMessage(tc.schema)), tc.want)
		})
	}
}

func TestWithProgressRef(t *testing.T) {
	t.Parallel()
	ref := protocol.StreamChannelRef{ChannelID: "c", AccessKey: "k", Direction: protocol.DirectionWrite}
	const refJSON = `{"channel_id":"c","access_key":"k","direction":"write"}`
	for _, tc := range []struct {
		name, in, want string
		ok             bool
	}{
		{"empty payload", ``, `{"progress":` + refJSON + `}`, true},
		{"empty object", ` {} `, `{"progress":` + refJSON + `}`, true},
		{"keys keep their order", `{"image":"python","code":"x"}`, `{"image":"python","code":"x","progress":` + refJSON + `}`, true},
		{"the caller's own value wins", `{"progress":null}`, ``, false},
		{"an array", `[1]`, ``, false},
		{"a string", `"x"`, ``, false},
		{"broken", `{"a":`, ``, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := withProgressRef(json.RawMessage(tc.in), "progress", ref)
			assert.Equal(t, ok, tc.ok)
			if !ok {
				return
			}
			assert.Equal(t, string(got), tc.want)
			assert.Assert(t, json.Valid(got))
		})
	}
}

func pev(phase string) contract.ProgressEvent {
	return contract.ProgressEvent{Phase: phase, Image: "python", ImageRef: "docker.io/iiidev/python:latest"}
}

func TestProgressRenderer(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	events := []contract.ProgressEvent{
		pev(contract.ProgressPulling),
		pev(contract.ProgressPulling).WithBytes(0, 8*mib),
		pev(contract.ProgressPulling).WithBytes(3*mib, 8*mib),
		pev(contract.ProgressPulling).WithBytes(8*mib, 8*mib),
		pev(contract.ProgressUnpacking).WithBytes(8*mib, 8*mib),
		pev(contract.ProgressBuilding).WithBytes(2048, 0),
		pev(contract.ProgressBooting),
		{Phase: contract.ProgressReady, Image: "python", ImageRef: "docker.io/iiidev/python:latest", SandboxID: "s-1"},
	}
	const name = "python (docker.io/iiidev/python:latest): "
	t.Run("plain", func(t *testing.T) {
		var b bytes.Buffer
		r := newProgressRenderer(&b, false)
		for _, ev := range events {
			r.event(ev)
		}
		r.finish()
		assert.Equal(t, b.String(), strings.Join([]string{
			name + "pulling",
			name + "pulling [=========               ]  37% 3.0 MiB of 8.0 MiB",
			name + "pulling [========================] 100% 8.0 MiB of 8.0 MiB",
			name + "unpacking [========================] 100% 8.0 MiB of 8.0 MiB",
			name + "building the root filesystem 2.0 KiB",
			name + "booting the VM",
			name + "ready, sandbox s-1",
		}, "\n")+"\n")
	})
	t.Run("terminal", func(t *testing.T) {
		var b bytes.Buffer
		r := newProgressRenderer(&b, true)
		for _, ev := range events[:4] {
			r.event(ev)
		}
		r.event(events[6])
		r.finish()
		const cr = "\r\x1b[K"
		assert.Equal(t, b.String(),
			cr+name+"pulling"+
				cr+name+"pulling [                        ]   0% 0 B of 8.0 MiB"+
				cr+name+"pulling [=========               ]  37% 3.0 MiB of 8.0 MiB"+
				cr+name+"pulling [========================] 100% 8.0 MiB of 8.0 MiB"+
				"\n"+cr+name+"booting the VM\n")
	})
	t.Run("a phase of a newer adapter, no image", func(t *testing.T) {
		var b bytes.Buffer
		r := newProgressRenderer(&b, false)
		r.event(contract.ProgressEvent{Phase: "verifying  signatures", BytesDone: new(uint64(5))})
		r.event(contract.ProgressEvent{Phase: contract.ProgressReady})
		assert.Equal(t, b.String(), "sandbox: verifying signatures 5 B\nsandbox: ready\n")
	})
	t.Run("nothing drawn, nothing to finish", func(t *testing.T) {
		var b bytes.Buffer
		newProgressRenderer(&b, true).finish()
		assert.Equal(t, b.String(), "")
	})
}

// progressFn is the handler of the scripts' test::progress: it writes a
// pull's progress into the channel it is given and reports what it got.
func progressFn(c *client.Client) client.Handler {
	return func(ctx context.Context, inv *client.Invocation) (any, error) {
		var in struct {
			Progress json.RawMessage `json:"progress"`
		}
		if err := json.Unmarshal(inv.Data, &in); err != nil {
			return nil, err
		}
		var ref protocol.StreamChannelRef
		if json.Unmarshal(in.Progress, &ref) != nil || ref.ChannelID == "" {
			return map[string]any{"progress": in.Progress}, nil
		}
		w, err := c.OpenChannelWriter(ctx, ref)
		if err != nil {
			return nil, err
		}
		for _, ev := range []contract.ProgressEvent{
			pev(contract.ProgressPulling).WithBytes(0, 4096),
			pev(contract.ProgressPulling).WithBytes(4096, 4096),
			pev(contract.ProgressBooting),
			{Phase: contract.ProgressReady, Image: "python", ImageRef: "docker.io/iiidev/python:latest", SandboxID: "s-1"},
		} {
			b, err := json.Marshal(ev)
			if err != nil {
				return nil, err
			}
			if err := w.SendText(ctx, string(b)); err != nil {
				return nil, err
			}
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
		return map[string]any{"progress": "channel", "direction": ref.Direction}, nil
	}
}

// progressRequestSchema marks test::progress's progress field the way the
// plugin host marks sandbox::create's.
const progressRequestSchema = `{"type":"object","properties":{"image":{"type":"string"},` +
	`"progress":{"type":"object","x-iii-progress":true}}}`
