//go:build linux || darwin

package libkrun

import (
	"sort"
	"strings"
)

// Feature is a build option krun_has_feature reports (KRUN_FEATURE_* in
// libkrun.h). SND and EFI were declared from 1.17.3 to 1.19 and later
// dropped; a library that does not know an id answers -EINVAL, which reads
// as "absent".
type Feature struct {
	ID   uint64
	Name string
}

// Features returns the feature ids libkrun.h has defined.
func Features() []Feature {
	return []Feature{
		{0, "net"}, {1, "blk"}, {2, "gpu"}, {3, "snd"}, {4, "input"}, {5, "efi"},
		{6, "tee"}, {7, "amd-sev"}, {8, "intel-tdx"}, {9, "aws-nitro"},
		{10, "virgl-resource-map2"}, {11, "init-blob"},
	}
}

// BuildFeatures lists the build options of the library. With
// krun_has_feature (1.17.3+) they are asked for; before that only blk and
// net can be told, from the symbols they add. source says which.
func (l *Lib) BuildFeatures() (features []string, source string) {
	features = []string{}
	if l.fn.hasFeature != nil {
		for _, f := range Features() {
			if l.fn.hasFeature(f.ID) == 1 {
				features = append(features, f.Name)
			}
		}
		return features, "krun_has_feature"
	}
	if l.Has("krun_add_disk") || l.Has("krun_add_disk2") {
		features = append(features, "blk")
	}
	if l.Has("krun_add_net_unixstream") {
		features = append(features, "net")
	}
	return features, "symbols"
}

// Facts describes the library for adapter::info: where it is, the oldest
// release that matches its symbols, which optional symbols it lacks, its
// build options, the hypervisor's vCPU limit, and whether Boot can run a
// VM with a root disk and network (the adapter's usual VM) and if not, why.
func (l *Lib) Facts() map[string]any {
	m := map[string]any{
		"libkrun_path":    l.path,
		"symbols_missing": l.Missing(),
	}
	if v, ok := l.MinVersion(); ok {
		m["libkrun_min_version"] = v.String()
	}
	features, source := l.BuildFeatures()
	m["features"] = features
	m["features_source"] = source
	if l.fn.getMaxVCPUs != nil {
		if n := l.fn.getMaxVCPUs(); n > 0 {
			m["max_vcpus"] = int(n)
		}
	}
	if l.fn.checkNestedVirt != nil {
		if r := l.fn.checkNestedVirt(); r >= 0 {
			m["nested_virt"] = r == 1
		}
	}
	if err := l.CheckBoot(true, true); err != nil {
		m["boot_ready"] = false
		m["boot_missing"] = l.bootMissing(true, true, true)
	} else {
		m["boot_ready"] = true
	}
	return m
}

// CheckBoot says whether Boot can run a VM with or without a root disk and
// network (and with a kernel console log) on this library; the error names
// what is missing and which release or build option adds it.
func (l *Lib) CheckBoot(rootDisk, network bool) error {
	return l.checkBoot(rootDisk, network, true)
}

func (l *Lib) checkBoot(rootDisk, network, consoleLog bool) error {
	missing := l.bootMissing(rootDisk, network, consoleLog)
	if len(missing) == 0 {
		return nil
	}
	var why []string
	for _, name := range missing {
		s, _ := symbolIndex(l.table, name)
		switch s.Build {
		case BuildBLK:
			why = append(why, name+" (libkrun built without BLK=1, or older than "+s.Since+")")
		case BuildNET:
			why = append(why, name+" (libkrun built without NET=1, or older than "+s.Since+")")
		default:
			why = append(why, name+" (added in libkrun "+s.Since+")")
		}
	}
	sort.Strings(why)
	msg := "this libkrun cannot boot a sandbox VM: missing " + strings.Join(why, ", ") + "; install libkrun 1.17 or newer built with BLK=1 NET=1, or use hypervisor: qemu"
	return &Error{Code: CodeTooOld, Message: msg}
}

// bootMissing lists, for each need of Boot with no alternative present,
// the preferred symbol.
func (l *Lib) bootMissing(rootDisk, network, consoleLog bool) []string {
	out := []string{}
	for _, alts := range bootNeeds(rootDisk, network, consoleLog) {
		ok := false
		for _, a := range alts {
			ok = ok || l.Has(a)
		}
		if !ok {
			out = append(out, alts[0])
		}
	}
	sort.Strings(out)
	return out
}
