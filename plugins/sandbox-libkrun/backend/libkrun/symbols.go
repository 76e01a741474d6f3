//go:build linux || darwin

package libkrun

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is a libkrun release number.
type Version struct{ Major, Minor, Patch int }

// ParseVersion reads "1.17.3" or "v1.17.3".
func ParseVersion(s string) (Version, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), "v")
	parts := strings.Split(t, ".")
	if len(parts) != 3 {
		return Version{}, fmt.Errorf("version %q: want MAJOR.MINOR.PATCH", s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || v > 9999 || p == "" || (len(p) > 1 && p[0] == '0') {
			return Version{}, fmt.Errorf("version %q: part %q is not a number", s, p)
		}
		n[i] = v
	}
	return Version{n[0], n[1], n[2]}, nil
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less orders versions.
func (v Version) Less(o Version) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

// Build options that remove symbols from libkrun when off (Makefile BLK=1,
// NET=1): a missing symbol of this kind says "built without", not "old".
const (
	BuildBLK = "blk"
	BuildNET = "net"
)

// Symbol describes one libkrun function this back end binds.
type Symbol struct {
	Name string
	// Since is the first release whose include/libkrun.h declares it
	// (found with git log -S over the tags; see docs/libkrun.md).
	Since string
	// Required symbols must be present for Open to succeed; every other
	// one is optional and its absence only disables what needs it.
	Required bool
	// Build is BuildBLK or BuildNET when the symbol exists only in
	// libraries built with that option.
	Build string
	// Use says what the back end uses it for.
	Use string
}

// Symbols returns the table of every libkrun symbol this package binds.
// It is a function, not a variable, so nobody can change it.
func Symbols() []Symbol {
	return []Symbol{
		// The four calls every libkrun since 0.1 has and without which
		// no VM can exist.
		{Name: "krun_create_ctx", Since: "0.1.1", Required: true, Use: "create the configuration context"},
		{Name: "krun_free_ctx", Since: "0.1.1", Required: true, Use: "drop the context when configuration fails"},
		{Name: "krun_set_vm_config", Since: "0.1.1", Required: true, Use: "vCPUs and memory"},
		{Name: "krun_start_enter", Since: "0.1.1", Required: true, Use: "start the VM (never returns on success)"},

		{Name: "krun_set_log_level", Since: "0.1.1", Use: "log level, when krun_init_log is missing"},
		{Name: "krun_set_env", Since: "1.3.0", Use: "explicit guest environment (never NULL: NULL copies the host's)"},
		{Name: "krun_get_shutdown_eventfd", Since: "1.8.0", Use: "orderly guest shutdown on context cancel (macOS/arm64 only)"},
		{Name: "krun_add_disk", Since: "1.9.5", Build: BuildBLK, Use: "root image, raw, read-only (fallback)"},
		{Name: "krun_add_disk2", Since: "1.10.0", Build: BuildBLK, Use: "root image with an explicit raw format, read-only"},
		{Name: "krun_set_kernel", Since: "1.11.0", Use: "our kernel, initramfs and command line"},
		{Name: "krun_check_nested_virt", Since: "1.12.0", Use: "capability report"},
		{Name: "krun_init_log", Since: "1.13.0", Use: "log to stderr without colours or env overrides"},
		{Name: "krun_add_net_unixstream", Since: "1.15.0", Build: BuildNET, Use: "virtio-net NIC (the runner's user-mode network)"},
		{Name: "krun_disable_implicit_console", Since: "1.16.0", Use: "no console on the runner's stdio"},
		{Name: "krun_add_serial_console_default", Since: "1.16.0", Use: "kernel console to a log file"},
		{Name: "krun_get_max_vcpus", Since: "1.16.0", Use: "capability report"},
		{Name: "krun_add_virtio_console_multiport", Since: "1.17.0", Use: "console device holding the iii.exec port"},
		{Name: "krun_add_console_port_inout", Since: "1.17.0", Use: "the named iii.exec port"},
		{Name: "krun_disable_implicit_vsock", Since: "1.17.0", Use: "no vsock, hence no TSI: the guest has no way out without a NIC"},
		{Name: "krun_has_feature", Since: "1.17.3", Use: "build options (NET, BLK, ...) for the capability report"},
	}
}

// symbolIndex finds a symbol in the table.
func symbolIndex(table []Symbol, name string) (Symbol, bool) {
	for _, s := range table {
		if s.Name == name {
			return s, true
		}
	}
	return Symbol{}, false
}

// InferMinVersion returns the oldest release that declares every symbol in
// present: the newest "since" among them. A library with a symbol this
// table does not know says nothing about it. ok is false when present
// names none of the table's symbols.
func InferMinVersion(table []Symbol, present []string) (v Version, ok bool) {
	for _, name := range present {
		s, found := symbolIndex(table, name)
		if !found {
			continue
		}
		sv, err := ParseVersion(s.Since)
		if err != nil {
			continue
		}
		if !ok || v.Less(sv) {
			v, ok = sv, true
		}
	}
	return v, ok
}

// bootNeeds lists the symbols Boot calls for a VM with or without a root
// disk and network, each with an alternative when one exists (either
// krun_add_disk2 or krun_add_disk; either krun_init_log or
// krun_set_log_level).
func bootNeeds(rootDisk, network, consoleLog bool) [][]string {
	need := [][]string{
		{"krun_init_log", "krun_set_log_level"},
		{"krun_set_kernel"},
		{"krun_set_env"},
		{"krun_disable_implicit_console"},
		{"krun_add_virtio_console_multiport"},
		{"krun_add_console_port_inout"},
		{"krun_disable_implicit_vsock"},
	}
	if consoleLog {
		need = append(need, []string{"krun_add_serial_console_default"})
	}
	if rootDisk {
		need = append(need, []string{"krun_add_disk2", "krun_add_disk"})
	}
	if network {
		need = append(need, []string{"krun_add_net_unixstream"})
	}
	return need
}
