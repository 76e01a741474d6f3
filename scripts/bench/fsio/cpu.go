package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Where the CPU goes during a transfer: on a 2-core machine the emulated
// guest takes most of one core, so every host process on the data path
// (this process, which holds the engine and the caller; the adapter; the
// runner; QEMU) competes with it. cpuTimes reads the user+system time of
// this process and all its descendants from /proc, by command name.

// clkTck is USER_HZ, 100 on every Linux this runs on.
const clkTck = 100

type cpuSample map[string]time.Duration

// cpuTimes returns the CPU time of this process and its descendants so
// far, summed by command name. Failures to read a process (it just exited)
// leave it out.
func cpuTimes() cpuSample {
	type proc struct {
		ppid int
		comm string
		cpu  time.Duration
	}
	procs := map[int]proc{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// comm is in parentheses and may hold spaces; the fields after
		// the last ')' are fixed.
		i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if i < 0 || j < i {
			continue
		}
		f := strings.Fields(string(b[j+1:]))
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		procs[pid] = proc{ppid: ppid, comm: string(b[i+1 : j]), cpu: time.Duration(ut+st) * time.Second / clkTck}
	}
	self := os.Getpid()
	out := cpuSample{}
	for pid, p := range procs {
		// Walk up to this process; a cycle cannot happen in /proc but a
		// bound keeps a bad read from looping.
		for q, n := pid, 0; n < 64 && q > 1; n++ {
			if q == self {
				name := p.comm
				if pid == self {
					name = "bench+engine"
				}
				out[name] += p.cpu
				break
			}
			q = procs[q].ppid
		}
	}
	return out
}

// sub returns s minus an earlier sample.
func (s cpuSample) sub(before cpuSample) cpuSample {
	out := cpuSample{}
	for k, v := range s {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// add accumulates d into s.
func (s cpuSample) add(d cpuSample) {
	for k, v := range d {
		s[k] += v
	}
}

// String lists the processes by CPU time, largest first.
func (s cpuSample) String() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return s[keys[i]] > s[keys[j]] })
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.2f s", k, s[k].Seconds())
	}
	return b.String()
}
