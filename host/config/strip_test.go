package config

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestStripWorkerConfig(t *testing.T) {
	const c = "# moved"
	tests := []struct {
		name, in, want string
		stripped       bool
	}{
		{
			name:     "nested block, neighbours and placeholders kept",
			in:       "workers:\n  - name: iii-worker-manager\n    config: { port: ${PORT:49134} }\n  - name: iii-stream   # streams\n    config:\n      port: ${STREAM_PORT:3112}\n      adapter:\n        name: kv\n\n        config: { store_method: file_based }\n  - name: iii-http-functions\nsandbox: {}\n",
			want:     "workers:\n  - name: iii-worker-manager\n    config: { port: ${PORT:49134} }\n  - name: iii-stream   # streams\n    # moved\n  - name: iii-http-functions\nsandbox: {}\n",
			stripped: true,
		},
		{
			name:     "inline block, quoted name, last in the file",
			in:       "workers:\n- name: \"iii-stream\"\n  config: { port: 3112, host: 127.0.0.1 }",
			want:     "workers:\n- name: \"iii-stream\"\n  # moved",
			stripped: true,
		},
		{
			name:     "a blank line before the next entry stays",
			in:       "workers:\n  - name: iii-stream\n    config:\n      port: 1\n\n  - name: configuration\n",
			want:     "workers:\n  - name: iii-stream\n    # moved\n\n  - name: configuration\n",
			stripped: true,
		},
		{name: "no config key", in: "workers:\n  - name: iii-stream\n  - name: configuration\n    config: {}\n", stripped: false},
		{name: "no such entry", in: "workers:\n  - name: iii-streams\n    config: {}\n", stripped: false},
		{name: "flow style entry", in: "workers: [{name: iii-stream, config: {port: 1}}]\n", stripped: false},
		{name: "another entry's nested name", in: "workers:\n  - name: x\n    config:\n      adapter:\n        - name: iii-stream\n          config: {}\n", stripped: false},
		{name: "not under workers", in: "other:\n  - name: iii-stream\n    config: {}\nworkers: []\n", stripped: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, ok := StripWorkerConfig([]byte(tc.in), "iii-stream", c)
			assert.Equal(t, ok, tc.stripped)
			if !tc.stripped {
				assert.Equal(t, string(out), tc.in)
				return
			}
			assert.Equal(t, string(out), tc.want)
		})
	}
}

func FuzzStripWorkerConfig(f *testing.F) {
	f.Add([]byte("workers:\n  - name: iii-stream\n    config:\n      port: 1\n"))
	f.Add([]byte("workers:\n- name: iii-stream\n  config: {}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, ok := StripWorkerConfig(in, "iii-stream", "# moved")
		if !ok && string(out) != string(in) {
			t.Fatalf("changed the text without stripping")
		}
	})
}
