package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Sandboxes outlive the adapter (docs/sandbox-libkrun.md, "Sandboxes
// outlive the adapter"). Every sandbox's runner is started with
// adopt_grace_ms: when the adapter goes (a crash, kill -9, the plugin host
// restarting it, an upgrade, the engine stopping), the runner keeps its VM
// that long, waiting for the next adapter process of the same state_dir.
// That process finds each sandbox's sandbox.json, takes the state
// directory's lock, proves to the runner it holds the runner's secret
// (runner.Adopt), dials the guest agent again and hands the sandbox to the
// kit under its id, with its limits and idle timer. A paused sandbox has no
// runner: its directory (pause.json, pause.state, the overlay) is adopted
// as it is. Whatever cannot be adopted is cleaned as a leftover, so no VM
// outlives the grace period.

// recordName is the sandbox's record in its state directory: what the kit
// knew of it, for the next adapter. The VM itself is described by the
// runner's runner.json (or pause.json while paused).
const recordName = "sandbox.json"

// recordFormat is sandbox.json's version; another is not adopted.
const recordFormat = 1

// sandboxRecord is sandbox.json.
type sandboxRecord struct {
	Format      int       `json:"format"`
	SandboxID   string    `json:"sandbox_id"`
	Name        string    `json:"name,omitempty"`
	Image       string    `json:"image"`
	Backend     string    `json:"backend"`
	Created     time.Time `json:"created"`
	IdleTimeout int64     `json:"idle_timeout_ms,omitempty"`
	Network     bool      `json:"network,omitempty"`
	Env         []string  `json:"env,omitempty"`
	Workdir     string    `json:"workdir,omitempty"`
	// LastActivity is the kit's idle clock, written when the adapter
	// detaches; an adapter that crashed did not get to write it.
	LastActivity time.Time `json:"last_activity,omitzero"`
}

// validate checks a record read back. The directory's name is the
// sandbox id, or the warm pool id of a VM a create claimed from the pool.
func (r *sandboxRecord) validate() error {
	switch {
	case r.Format != recordFormat:
		return fmt.Errorf("%s format %d, this adapter reads %d", recordName, r.Format, recordFormat)
	case r.Backend != backend.QEMU && r.Backend != backend.Libkrun:
		return fmt.Errorf("%s: unknown back end %q", recordName, r.Backend)
	case r.IdleTimeout < 0:
		return fmt.Errorf("%s: negative idle timeout", recordName)
	}
	if _, err := uuid.Parse(r.SandboxID); err != nil {
		return fmt.Errorf("%s: sandbox id: %w", recordName, err)
	}
	return nil
}

// writeFileAtomic replaces path with b (0600), so a reader never sees half
// a file.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// writeRecord writes the sandbox's sandbox.json.
func (s *sandbox) writeRecord(rec sandboxRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(s.dir.File(recordName), b)
}

var (
	_ sandboxkit.Adopter    = (*Provider)(nil)
	_ sandboxkit.Detachable = (*sandbox)(nil)
)

// KeepsSandboxes implements sandboxkit.Adopter: with adopt_grace_ms, the
// adapter's shutdown leaves every sandbox to the next adapter process.
func (p *Provider) KeepsSandboxes() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg != nil && p.current().AdoptGrace > 0
}

// AdoptSandboxes implements sandboxkit.Adopter: it hands the kit the
// sandboxes Configure adopted.
func (p *Provider) AdoptSandboxes(context.Context) ([]sandboxkit.Adopted, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.adopted
	p.adopted = nil
	return out, nil
}

// adoptAll adopts every sandbox an earlier adapter process left under
// stateDir, in parallel; the directories it cannot adopt are left to the
// leftover clean-up that follows.
func (p *Provider) adoptAll(ctx context.Context, cfg *config.Config) []sandboxkit.Adopted {
	des, err := os.ReadDir(cfg.StateDir)
	if err != nil {
		return nil
	}
	var (
		mu  sync.Mutex
		out []sandboxkit.Adopted
		wg  sync.WaitGroup
	)
	t0 := time.Now()
	for _, de := range des {
		name := de.Name()
		if !de.IsDir() || len(name) != config.SandboxDirLen || !runner.ValidDirName(name) {
			continue
		}
		if _, err := os.Lstat(filepath.Join(cfg.StateDir, name, recordName)); err != nil {
			continue // a pooled VM never claimed, a failed boot: a leftover
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, boot.AdoptTimeout)
			defer cancel()
			a, err := p.adoptDir(actx, cfg, name)
			log := p.log.With("state_dir", name)
			switch {
			case errors.Is(err, runner.ErrLocked):
				log.Debug("a live adapter holds this sandbox; not adopting it")
			case err != nil:
				log.Warn("could not adopt a sandbox an earlier adapter process left; cleaning it up", "error", err.Error())
			default:
				mu.Lock()
				out = append(out, a)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(out) > 0 {
		p.log.Info("adopted sandboxes", "count", len(out), "ms", time.Since(t0).Milliseconds())
	}
	return out
}

// adoptDir adopts one sandbox's state directory.
func (p *Provider) adoptDir(ctx context.Context, cfg *config.Config, name string) (sandboxkit.Adopted, error) {
	dir, err := runner.OpenDir(cfg.StateDir, name)
	if err != nil {
		return sandboxkit.Adopted{}, err
	}
	release := func(err error) (sandboxkit.Adopted, error) {
		dir.Release()
		return sandboxkit.Adopted{}, err
	}
	var rec sandboxRecord
	if err := boot.ReadJSONFile(dir.File(recordName), boot.MaxRecordBytes, &rec); err != nil {
		return release(err)
	}
	if err := rec.validate(); err != nil {
		return release(err)
	}
	id := rec.SandboxID
	s := &sandbox{
		p: p, id: id, backend: rec.Backend, dir: dir,
		env: rec.Env, workdir: rec.Workdir, rec: rec,
		gone:    make(chan struct{}),
		cleaned: make(chan struct{}),
	}
	var meta pauseMeta
	switch err := boot.ReadJSONFile(dir.File(pauseMetaName), boot.MaxRecordBytes, &meta); {
	case err == nil:
		if meta.Format != pauseFormat || meta.SandboxID != id || meta.Runner.Validate() != nil {
			return release(fmt.Errorf("%s does not describe this sandbox", pauseMetaName))
		}
		if _, err := os.Stat(dir.File(pauseStateName)); err != nil {
			return release(fmt.Errorf("paused, but its saved state is missing: %w", err))
		}
		// A paused sandbox has no runner; resume starts one from here.
		s.vm, s.paused = meta.Runner.Spec, true
		s.vm.Template = nil
		if meta.Runner.Spec.Template != nil && meta.Runner.Spec.Template.MemoryFile != "" {
			s.vm.Template = &backend.Template{MemoryFile: meta.Runner.Spec.Template.MemoryFile}
		}
	case !errors.Is(err, os.ErrNotExist):
		return release(err)
	default:
		var rc runner.Config
		if err := boot.ReadJSONFile(dir.File(runner.ConfigName), boot.MaxRecordBytes, &rc); err != nil {
			return release(err)
		}
		if err := rc.Validate(); err != nil {
			return release(err)
		}
		if filepath.Clean(rc.Spec.StateDir) != filepath.Clean(dir.Path) {
			return release(fmt.Errorf("%s names another state directory, %s", runner.ConfigName, rc.Spec.StateDir))
		}
		proc, err := runner.Adopt(ctx, dir)
		if err != nil {
			return release(fmt.Errorf("take over its runner: %w", err))
		}
		agent, err := boot.DialAgent(ctx, proc, rc.Spec.SocketPath(), p.log.With("sandbox_id", id))
		if err != nil {
			// Detach, not Release: a VM whose agent is slow to answer
			// may still be adopted by the next try, within the grace.
			proc.Detach()
			return release(fmt.Errorf("reach its guest agent again: %w", err))
		}
		s.vm, s.proc, s.agent = rc.Spec, proc, agent
		if rec.Network && agent.Has(agentproto.CapNetStats) {
			tick := sandboxkit.DefaultReaperTick
			if p.kit != nil {
				tick = p.kit.ReaperTick
			}
			s.net = newNetActivity(func(ctx context.Context) (*agentproto.NetStats, error) {
				return s.ag().NetStats(ctx, "")
			}, tick)
		}
		go s.watch(proc)
	}
	p.mu.Lock()
	p.sandboxes[s] = struct{}{}
	p.mu.Unlock()
	return sandboxkit.Adopted{
		Sandbox: s, ID: id, Name: rec.Name, Image: rec.Image, Created: rec.Created,
		IdleTimeout:  time.Duration(rec.IdleTimeout) * time.Millisecond,
		LastActivity: rec.LastActivity, Paused: s.paused,
	}, nil
}

// Detach implements sandboxkit.Detachable: the sandbox is left as it is,
// for the next adapter process: its record gets the kit's idle clock, the
// agent connection closes, the runner's lifeline is let go without the
// stop word (the runner waits adopt_grace_ms), and the state directory's
// lock is dropped so the next adapter can take it.
func (s *sandbox) Detach(_ context.Context, lastActivity time.Time) error {
	s.move.Lock()
	defer s.move.Unlock()
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return errors.New("the sandbox is stopping")
	}
	s.stopping = true // no Stop may follow: the sandbox is not ours
	s.detached = true
	rec := s.rec
	rec.LastActivity = lastActivity.UTC()
	s.rec = rec
	proc, agent := s.proc, s.agent
	s.mu.Unlock()
	err := s.writeRecord(rec)
	if agent != nil {
		_ = agent.Close()
	}
	if proc != nil {
		proc.Detach()
	}
	s.p.forget(s)
	s.dir.Release()
	return err
}
