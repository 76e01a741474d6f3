package boot

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Snapshot templates (QEMU back end). The first cold boot of an image in a
// shape starts, in the background, the recording of a template: a VM of
// that image and shape boots with its RAM written through to a memory file,
// and once its agent is ready it is saved (device state over QMP) and
// quit. Later boots of the same image and shape restore from it instead of
// booting: package qemu's template.go explains the files. A restored VM is
// then made fresh (configure-guest): its own RNG seed credited and the CRNG
// reseeded, the host's clock, its own host name.
//
// state_dir/templates/<slot>/<id>/ holds one template: slot names the image
// and shape, id hashes everything the saved state depends on (templateKey),
// so a new kernel, initramfs (the agent is inside it), QEMU, image digest
// or shape gives a new id, and the slot's older template is deleted when
// the new one is saved. Templates are written under a temporary name and
// renamed when complete, so a directory with an id name is whole.

// templateFormat changes whenever what a template holds or how it is
// restored changes, which invalidates every saved one.
const templateFormat = 1

// Template files.
const (
	templatesDirName  = "templates"
	templateMemName   = "mem"
	templateStateName = "state"
	templateMetaName  = "meta.json"
)

// templateRetryAfter is how long a template that failed to record or to
// restore is not tried again.
const templateRetryAfter = 10 * time.Minute

// templateSaveTimeout bounds saving a recorded template.
const templateSaveTimeout = 2 * time.Minute

// fileID identifies a file's version cheaply: a replaced kernel, agent
// image or QEMU binary changes its size or modification time.
type fileID struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	ModNano int64  `json:"mod_nano"`
}

func idOf(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	return fileID{Path: path, Size: fi.Size(), ModNano: fi.ModTime().UnixNano()}, nil
}

// templateKey is everything a saved VM depends on: a restore must use the
// same command line, disks and guest software as the save.
type templateKey struct {
	Format    int    `json:"format"`
	Image     string `json:"image"`
	Digest    string `json:"digest"`
	Rootfs    fileID `json:"rootfs"`
	Kernel    fileID `json:"kernel"`
	Initrd    fileID `json:"initrd"`
	QEMU      fileID `json:"qemu"`
	Accel     string `json:"accel"`
	CPUs      int    `json:"cpus"`
	MemoryMiB int    `json:"memory_mib"`
	Network   bool   `json:"network"`
}

// id is the key's hash: the template directory's name.
func (k templateKey) id() string {
	b, _ := json.Marshal(k)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

var slotUnsafe = regexp.MustCompile(`[^a-z0-9_.-]+`)

// slot names the image and shape: one template per slot is kept.
func (k templateKey) slot() string {
	name := slotUnsafe.ReplaceAllString(k.Image, "_")
	if len(name) > 40 {
		name = name[:40]
	}
	s := fmt.Sprintf("%s-%dc%dm", name, k.CPUs, k.MemoryMiB)
	if k.Network {
		s += "-net"
	}
	return s
}

// templateMeta is meta.json: the key, and when the template was saved.
type templateMeta struct {
	Key     templateKey `json:"key"`
	SavedAt time.Time   `json:"saved_at"`
	// SaveMS is how long the save took, BootMS the boot it replaces.
	SaveMS int64 `json:"save_ms"`
	BootMS int64 `json:"boot_ms"`
}

// Templates is the snapshot template store: it finds, records and evicts the adapter's templates.
type Templates struct {
	h    Host
	root string

	mu sync.Mutex
	// enabled is snapshot_templates and maxBytes snapshot_templates_max_mb,
	// as last reloaded (the adapter's reconfigure.go). Disabled, the store is
	// neither looked in nor recorded to; what it holds stays on disk.
	enabled   bool
	maxBytes  int64
	recording map[string]bool      // slot → a recording is under way
	failed    map[string]time.Time // id → when it last failed
	// recorded and restored count, for adapter::info.
	recorded, restored, restoreFails int
	wg                               sync.WaitGroup
}

// NewTemplates returns the store even with snapshot_templates off, so
// that a reload can turn it on.
func NewTemplates(h Host, cfg *config.Config) *Templates {
	return &Templates{
		h: h, root: filepath.Join(cfg.StateDir, templatesDirName),
		enabled:   cfg.SnapshotTemplates,
		maxBytes:  int64(cfg.SnapshotTemplatesMaxMB) << 20,
		recording: map[string]bool{}, failed: map[string]time.Time{},
	}
}

// on reports whether templates are used; a nil store is off.
func (s *Templates) on() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.enabled
}

// Apply takes a reloaded snapshot_templates and snapshot_templates_max_mb:
// turned on, what a crashed recording left is swept first (as at start);
// a lower ceiling evicts at once.
func (s *Templates) Apply(ctx context.Context, enabled bool, maxMB uint64) {
	if s == nil {
		return
	}
	s.mu.Lock()
	was := s.enabled
	s.enabled, s.maxBytes = enabled, int64(maxMB)<<20
	s.mu.Unlock()
	if enabled && !was {
		s.CleanLeftovers(ctx)
	}
	if enabled {
		s.evict()
	}
}

// keyFor is the key of a boot that reached build-initramfs, and whether
// the boot may use a template at all: QEMU only, sandboxes only (a worker
// VM's data disk is its own; its boot sets NoTemplate, since the disk is
// attached after find-template).
func (s *Templates) keyFor(b *Boot) (templateKey, bool) {
	if !s.on() || b.Selection == nil || b.Selection.Backend != backend.QEMU || b.DataDisk != "" || b.Image == nil || b.Initrd == "" {
		return templateKey{}, false
	}
	k := templateKey{
		Format: templateFormat, Image: b.Spec.Image.Name, Digest: b.Image.Digest,
		Accel: b.Selection.Accel, CPUs: int(b.Spec.CPUs), MemoryMiB: int(b.Spec.MemoryMB), Network: b.Spec.Network,
	}
	var err error
	for _, f := range []struct {
		dst  *fileID
		path string
	}{{&k.Rootfs, b.Image.RootfsPath}, {&k.Kernel, b.Selection.Kernel.BootImage()}, {&k.Initrd, b.Initrd}, {&k.QEMU, b.Selection.QEMUBinary}} {
		if *f.dst, err = idOf(f.path); err != nil {
			return templateKey{}, false
		}
	}
	return k, true
}

// vmsDir holds the state directories of recording VMs.
func (s *Templates) vmsDir() string { return filepath.Join(s.root, ".vms") }

// CleanLeftovers sweeps what a crashed adapter's recordings left: their VMs
// (runner.CleanLeftovers kills them and removes their directories, unless
// a live adapter holds them) and half-written templates.
func (s *Templates) CleanLeftovers(ctx context.Context) {
	if !s.on() {
		return
	}
	runner.CleanLeftovers(ctx, s.vmsDir(), s.h.Log())
	slots, _ := os.ReadDir(s.root)
	for _, slot := range slots {
		if !slot.IsDir() || slot.Name() == ".vms" {
			continue
		}
		des, _ := os.ReadDir(filepath.Join(s.root, slot.Name()))
		for _, de := range des {
			fi, err := de.Info()
			// Another adapter sharing state_dir may be recording: only
			// a stale one is removed.
			if err == nil && strings.HasPrefix(de.Name(), ".recording-") && time.Since(fi.ModTime()) > 2*templateSaveTimeout {
				_ = os.RemoveAll(filepath.Join(s.root, slot.Name(), de.Name()))
			}
		}
	}
}

func (s *Templates) dir(k templateKey) string { return filepath.Join(s.root, k.slot(), k.id()) }

// lookup returns the template to restore b from, or nil.
func (s *Templates) lookup(k templateKey) *backend.Template {
	s.mu.Lock()
	failedAt, failed := s.failed[k.id()]
	s.mu.Unlock()
	if failed && time.Since(failedAt) < templateRetryAfter {
		return nil
	}
	dir := s.dir(k)
	t := &backend.Template{MemoryFile: filepath.Join(dir, templateMemName), StateFile: filepath.Join(dir, templateStateName)}
	if !FileExists(t.MemoryFile) || !FileExists(t.StateFile) {
		return nil
	}
	// The directory's time is its last use, for eviction.
	now := time.Now()
	_ = os.Chtimes(dir, now, now)
	return t
}

// restoreFailed forgets a template a restore failed from: it is deleted and
// not recorded again for a while.
func (s *Templates) restoreFailed(k templateKey, err error) {
	s.h.Log().Warn("restoring from a snapshot template failed; deleting it and booting cold", "template", k.slot()+"/"+k.id(), "error", err.Error())
	s.mu.Lock()
	s.failed[k.id()] = time.Now()
	s.restoreFails++
	s.mu.Unlock()
	_ = os.RemoveAll(s.dir(k))
}

// restoredOne counts a restore.
func (s *Templates) restoredOne() {
	s.mu.Lock()
	s.restored++
	s.mu.Unlock()
}

// recordLater starts recording the template of key k in the background,
// in the shape of spec, unless it exists, is being recorded, or failed
// lately. One recording runs per slot.
func (s *Templates) recordLater(k templateKey, spec sandboxkit.BootSpec, bootTime time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recording[k.slot()] {
		return
	}
	if at, ok := s.failed[k.id()]; ok && time.Since(at) < templateRetryAfter {
		return
	}
	if FileExists(filepath.Join(s.dir(k), templateStateName)) {
		return
	}
	s.recording[k.slot()] = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := s.record(s.h.Background(), k, spec, bootTime)
		s.mu.Lock()
		delete(s.recording, k.slot())
		if err != nil {
			s.failed[k.id()] = time.Now()
		} else {
			s.recorded++
		}
		s.mu.Unlock()
		if err != nil && s.h.Background().Err() == nil {
			s.h.Log().Warn("recording a snapshot template failed", "template", k.slot(), "error", err.Error())
		}
	}()
}

// record boots a VM of spec's image and shape with its RAM in a memory
// file, saves it once its agent is ready, and installs the template.
func (s *Templates) record(ctx context.Context, k templateKey, spec sandboxkit.BootSpec, bootTime time.Duration) (err error) {
	if err := os.MkdirAll(filepath.Join(s.root, k.slot()), 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.root, k.slot()), ".recording-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	spec.ID = uuid.New().String()
	spec.Env = nil
	b := &Boot{Host: s.h, Spec: spec, recordTemplate: &backend.Template{MemoryFile: filepath.Join(tmp, templateMemName)}}
	steps := s.h.Steps()
	if i, ierr := steps.index(StepConnectAgent); ierr == nil {
		// Saved before configure-guest: a clone configures itself.
		steps = steps[:i+1]
	}
	if err := steps.Run(ctx, b); err != nil {
		return err
	}
	// The recording VM never becomes a sandbox: whatever happens next,
	// it goes, with its state directory.
	defer b.rollback()
	got, ok := s.keyFor(b)
	if !ok || got.id() != k.id() {
		return errors.New("the image or the guest software changed while the template was recorded")
	}
	s.warm(ctx, b)
	// Whatever runs in the template runs in every clone: only the agent
	// (and the kernel's threads) may.
	if err := onlyAgentRuns(ctx, b); err != nil {
		return err
	}
	// A clone's agent must be waiting for a host, as at boot.
	_ = b.Agent.Close()
	sctx, cancel := context.WithTimeout(ctx, templateSaveTimeout)
	defer cancel()
	t0 := time.Now()
	if err := qemu.SaveTemplate(sctx, b.Dir.Path, filepath.Join(tmp, templateStateName)); err != nil {
		return err
	}
	saveTime := time.Since(t0)
	if err := qemu.Quit(sctx, b.Dir.Path); err != nil {
		return err
	}
	// Only once QEMU is gone may the memory file be used: until then the
	// guest could still write to it.
	// (A runner that exits with an error has still ended, and QEMU with
	// it; a wait cut short by the deadline or the adapter's shutdown
	// has not.)
	if err := b.Runner.Wait(sctx); err != nil && sctx.Err() != nil {
		return fmt.Errorf("the recording VM did not exit: %w", err)
	}
	meta, _ := json.Marshal(templateMeta{Key: k, SavedAt: time.Now().UTC(), SaveMS: saveTime.Milliseconds(), BootMS: bootTime.Milliseconds()})
	if err := os.WriteFile(filepath.Join(tmp, templateMetaName), meta, 0o600); err != nil {
		return err
	}
	final := s.dir(k)
	_ = os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	s.h.Log().Info("snapshot template saved", "template", k.slot()+"/"+k.id(), "save_ms", saveTime.Milliseconds(), "disk_bytes", diskUsage(final))
	s.dropOthers(k)
	s.evict()
	return nil
}

// warmScript starts, once, each interpreter sandbox::run uses that the
// image has, so that the files they read at start are in the template's
// page cache. Nothing is written: PYTHONDONTWRITEBYTECODE keeps python's
// bytecode cache out of the (template's) writable layer.
const warmScript = `command -v python3 >/dev/null 2>&1 && PYTHONDONTWRITEBYTECODE=1 python3 -c pass; ` +
	`command -v node >/dev/null 2>&1 && node -e 0; true`

// warmTimeout bounds the warm-up; a template saved without it is only
// slower to run the first program.
const warmTimeout = time.Minute

// warm runs warmScript in the recording VM; a failure is logged, not
// fatal.
func (s *Templates) warm(ctx context.Context, b *Boot) {
	wctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	t0 := time.Now()
	res, err := b.Agent.Exec(wctx, agentclient.ExecRequest{Argv: []string{"/bin/sh", "-c", warmScript}, Env: MergeEnv(b.Image.Config.Env), Timeout: warmTimeout})
	switch {
	case err != nil:
		s.h.Log().Warn("warming a snapshot template failed; saving it cold", "error", err.Error())
	case res.ExitCode != 0:
		s.h.Log().Warn("warming a snapshot template failed; saving it cold", "exit_code", res.ExitCode, "stderr", truncate(string(res.Stderr), 200))
	default:
		s.h.Log().Debug("snapshot template warmed", "ms", time.Since(t0).Milliseconds())
	}
}

// onlyAgentRuns fails when a process other than the agent (pid 1) and the
// kernel's threads (kthreadd, pid 2, and its children) is alive in the
// guest: say, a daemon an image's interpreter left behind at warm-up.
func onlyAgentRuns(ctx context.Context, b *Boot) error {
	cctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	ls, err := b.Agent.Ls(cctx, "/proc")
	if err != nil {
		return fmt.Errorf("list the guest's processes: %w", err)
	}
	for _, e := range ls.Entries {
		pid, err := strconv.Atoi(e.Name)
		if err != nil || pid <= 2 || !e.IsDir {
			continue
		}
		var stat strings.Builder
		if _, _, err := b.Agent.ReadFileTo(cctx, "/proc/"+e.Name+"/stat", &stat); err != nil {
			continue // it has exited meanwhile
		}
		if ppid, ok := parentPID(stat.String()); ok && ppid != 2 {
			return fmt.Errorf("process %d (%s) still runs in the recording VM; a template may hold nothing but the agent", pid, truncate(stat.String(), 80))
		}
	}
	return nil
}

// parentPID reads the parent pid from /proc/<pid>/stat: "pid (comm) state
// ppid ..."; comm may hold spaces and parentheses, so the fields after the
// last ")" are the ones to read.
func parentPID(stat string) (int, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// dropOthers deletes the slot's templates other than k's: they were made
// for another image digest, kernel, agent or QEMU.
func (s *Templates) dropOthers(k templateKey) {
	slot := filepath.Join(s.root, k.slot())
	des, err := os.ReadDir(slot)
	if err != nil {
		return
	}
	for _, de := range des {
		if de.Name() == k.id() || !isTemplateID(de.Name()) {
			continue
		}
		s.h.Log().Info("deleting an outdated snapshot template", "template", k.slot()+"/"+de.Name())
		_ = os.RemoveAll(filepath.Join(slot, de.Name()))
	}
}

func isTemplateID(name string) bool {
	if len(name) != 32 {
		return false
	}
	_, err := hex.DecodeString(name)
	return err == nil
}

// templateDir is one template on disk.
type templateDir struct {
	path  string
	used  time.Time
	bytes int64
}

// list returns every complete template.
func (s *Templates) list() []templateDir {
	var out []templateDir
	slots, _ := os.ReadDir(s.root)
	for _, slot := range slots {
		if !slot.IsDir() {
			continue
		}
		ids, _ := os.ReadDir(filepath.Join(s.root, slot.Name()))
		for _, id := range ids {
			if !id.IsDir() || !isTemplateID(id.Name()) {
				continue
			}
			p := filepath.Join(s.root, slot.Name(), id.Name())
			fi, err := os.Stat(p)
			if err != nil {
				continue
			}
			out = append(out, templateDir{path: p, used: fi.ModTime(), bytes: diskUsage(p)})
		}
	}
	return out
}

// evict deletes the least recently used templates until the rest fit
// snapshot_templates_max_mb.
func (s *Templates) evict() {
	all := s.list()
	sort.Slice(all, func(i, j int) bool { return all[i].used.After(all[j].used) })
	s.mu.Lock()
	maxBytes := s.maxBytes
	s.mu.Unlock()
	var total int64
	for _, t := range all {
		total += t.bytes
		if total > maxBytes {
			s.h.Log().Info("deleting a snapshot template over snapshot_templates_max_mb", "template", t.path, "disk_bytes", t.bytes)
			_ = os.RemoveAll(t.path)
			total -= t.bytes
		}
	}
}

// diskUsage is what the files under dir take on disk (memory files are
// sparse: only the pages the guest touched).
func diskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// Info is adapter::info's snapshot_templates.
func (s *Templates) Info() map[string]any {
	if !s.on() {
		return map[string]any{"enabled": false}
	}
	var bytes int64
	names := []string{}
	for _, t := range s.list() {
		bytes += t.bytes
		rel, _ := filepath.Rel(s.root, t.path)
		names = append(names, rel)
	}
	sort.Strings(names)
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string]any{
		"enabled": true, "dir": s.root, "templates": names, "disk_bytes": bytes, "max_bytes": s.maxBytes,
		"recording": len(s.recording), "recorded": s.recorded, "restored": s.restored, "restore_failed": s.restoreFails,
	}
}

// Wait waits for the recordings under way (their context is the
// provider's, canceled at shutdown).
func (s *Templates) Wait(ctx context.Context) error {
	if s == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for snapshot template recordings: %w", ctx.Err())
	}
}

// Freshen makes a VM that did not boot for its sandbox (claimed from the
// warm pool, or restored from a template) diverge from every sibling: the
// host's random bytes credited to its RNG with the CRNG reseeded, the
// host's clock, and the sandbox's own host name. An agent without the
// reseed capability is left as it is (false).
func Freshen(ctx context.Context, b *Boot, hostname string) (bool, error) {
	if !b.Agent.Has(agentproto.CapReseed) {
		return false, nil
	}
	seed := make([]byte, reseedBytes)
	if _, err := rand.Read(seed); err != nil {
		return false, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := b.Agent.Reseed(rctx, agentproto.ReseedRequest{Seed: seed, UnixNano: b.Host.Now().UnixNano(), Hostname: hostname})
	return err == nil, err
}

// reseedBytes is how much randomness a claimed or restored VM's RNG gets.
const reseedBytes = 64

// SandboxHostname is a sandbox guest's host name.
func SandboxHostname(id string) string {
	return "sandbox-" + id[:min(8, len(id))]
}

// truncate shortens s to n bytes for a log line or a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
