//go:build linux || darwin

package libkrun

import (
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestSymbolTable(t *testing.T) {
	table := Symbols()
	seen := map[string]bool{}
	var required []string
	for _, s := range table {
		t.Run(s.Name, func(t *testing.T) {
			assert.Assert(t, strings.HasPrefix(s.Name, "krun_"))
			assert.Assert(t, !seen[s.Name], "named twice")
			_, err := ParseVersion(s.Since)
			assert.NilError(t, err)
			assert.Assert(t, s.Use != "")
			assert.Assert(t, s.Build == "" || s.Build == BuildBLK || s.Build == BuildNET)
			// A symbol that only some builds have cannot be required.
			assert.Assert(t, !(s.Required && s.Build != ""))
		})
		seen[s.Name] = true
		if s.Required {
			required = append(required, s.Name)
		}
	}
	sort.Strings(required)
	// Minimal: only what every libkrun release has and no VM can do
	// without.
	assert.DeepEqual(t, required, []string{"krun_create_ctx", "krun_free_ctx", "krun_set_vm_config", "krun_start_enter"})

	// Every symbol has a binding and every binding a table row.
	var targets []string
	for name := range (&Lib{}).targets() {
		targets = append(targets, name)
	}
	var names []string
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(targets)
	sort.Strings(names)
	assert.DeepEqual(t, targets, names)

	// Everything Boot may call is in the table.
	for _, alts := range bootNeeds(true, true, true) {
		for _, a := range alts {
			assert.Check(t, seen[a], a)
		}
	}
}

func TestSymbolVersionsFromHeaderHistory(t *testing.T) {
	// Spot checks against the tag history of include/libkrun.h (see
	// docs/libkrun.md): the named console ports came with 1.17.0, not
	// with the 1.16.0 consoles.
	want := map[string]string{
		"krun_add_console_port_inout":       "1.17.0",
		"krun_add_virtio_console_multiport": "1.17.0",
		"krun_disable_implicit_console":     "1.16.0",
		"krun_disable_implicit_vsock":       "1.17.0",
		"krun_set_kernel":                   "1.11.0",
		"krun_has_feature":                  "1.17.3",
		"krun_add_net_unixstream":           "1.15.0",
	}
	for name, v := range want {
		s, ok := symbolIndex(Symbols(), name)
		assert.Assert(t, ok, name)
		assert.Check(t, is.Equal(s.Since, v), name)
	}
}

func TestParseVersion(t *testing.T) {
	tests := []struct {
		in   string
		want Version
		err  string
	}{
		{"1.17.3", Version{1, 17, 3}, ""},
		{"v1.9.5", Version{1, 9, 5}, ""},
		{" 0.1.1 ", Version{0, 1, 1}, ""},
		{"1.17", Version{}, "MAJOR.MINOR.PATCH"},
		{"1.17.3.1", Version{}, "MAJOR.MINOR.PATCH"},
		{"1.x.3", Version{}, "not a number"},
		{"1.-1.3", Version{}, "not a number"},
		{"1..3", Version{}, "not a number"},
		{"01.2.3", Version{}, "not a number"},
		{"", Version{}, "MAJOR.MINOR.PATCH"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseVersion(tc.in)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
			assert.Equal(t, got.String(), strings.TrimPrefix(strings.TrimSpace(tc.in), "v"))
		})
	}
}

func TestVersionLess(t *testing.T) {
	assert.Assert(t, Version{1, 9, 5}.Less(Version{1, 10, 0}))
	assert.Assert(t, Version{1, 17, 0}.Less(Version{1, 17, 3}))
	assert.Assert(t, Version{0, 9, 9}.Less(Version{1, 0, 0}))
	assert.Assert(t, !Version{1, 17, 3}.Less(Version{1, 17, 3}))
	assert.Assert(t, !Version{2, 0, 0}.Less(Version{1, 99, 99}))
}

func TestInferMinVersion(t *testing.T) {
	table := Symbols()
	tests := []struct {
		name    string
		present []string
		want    string
	}{
		{"nothing known", []string{"krun_something_new"}, ""},
		{"only the ancient core", []string{"krun_create_ctx", "krun_free_ctx", "krun_set_vm_config", "krun_start_enter"}, "0.1.1"},
		{"1.11 kernel", []string{"krun_create_ctx", "krun_set_kernel", "krun_add_disk"}, "1.11.0"},
		{"1.15 net", []string{"krun_set_kernel", "krun_init_log", "krun_add_net_unixstream"}, "1.15.0"},
		{"1.16 consoles", []string{"krun_disable_implicit_console", "krun_add_serial_console_default"}, "1.16.0"},
		{"1.17 ports", []string{"krun_add_console_port_inout", "krun_disable_implicit_console"}, "1.17.0"},
		{"1.17.3", []string{"krun_has_feature", "krun_add_console_port_inout"}, "1.17.3"},
		{"unknown symbols ignored", []string{"krun_set_kernel", "krun_fs_add_overlay_file"}, "1.11.0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := InferMinVersion(table, tc.present)
			if tc.want == "" {
				assert.Assert(t, !ok)
				return
			}
			assert.Assert(t, ok)
			assert.Equal(t, v.String(), tc.want)
		})
	}
}

func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"1.17.3", "v0.1.1", "1..", "9999.9999.9999", "1.2.3.4", "-1.2.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseVersion(s)
		if err != nil {
			return
		}
		// What parses prints back to something that parses the same.
		w, err := ParseVersion(v.String())
		if err != nil || w != v {
			t.Fatalf("%q -> %v -> %q -> %v, %v", s, v, v.String(), w, err)
		}
	})
}
