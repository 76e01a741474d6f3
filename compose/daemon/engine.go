package daemon

import (
	"context"

	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/engineproc"
	"github.com/iii-sandbox/iii/compose/state"
)

// EnvEngineLifeline names the fd of the lifeline pipe the managed engine
// inherits: when it reads EOF, Compose is gone and the engine stops.
const EnvEngineLifeline = engineproc.EnvLifeline

// startManaged starts the engine of f (compose/engineproc) and waits for
// its listener: the engine lock is taken before the project is opened, and
// the project token the engine gets is the one Compose sends.
func (d *Daemon) startManaged(ctx context.Context, f *composefile.File) error {
	d.applyNamespace(f)
	dir := state.DirFor(f.Path, f.Namespace, d.getenv)
	lock, err := state.LockEngine(dir, f.Path, f.Namespace)
	if err != nil {
		return err
	}
	p, err := d.projectFor(f)
	if err != nil {
		lock.Release()
		return err
	}
	spec := engineproc.Spec{
		File: f, Lock: lock, Store: p.store, Executable: d.exe, Logger: d.log, Out: d.out,
		Token: func() (string, error) {
			token, err := d.projectToken(p.store)
			if err == nil {
				d.token = token
			}
			return token, err
		},
	}
	if d.reaper != nil {
		spec.Tracker = d.reaper
	}
	m, err := engineproc.Start(ctx, spec)
	if m != nil {
		d.managed = m
	}
	return err
}

// applyNamespace makes f run in the daemon namespace when -n was given.
func (d *Daemon) applyNamespace(f *composefile.File) {
	if d.nsForced && f.Namespace != d.ns {
		f.SetNamespace(d.ns)
	}
}

// checkEngineSection applies the ownership rules to a file loaded by
// compose::up or restart: an engine: section needs this daemon to have
// started the engine for that very file, with the same section.
func (d *Daemon) checkEngineSection(f *composefile.File) error {
	if f.Engine == nil || f.Engine.Empty {
		return nil
	}
	if d.managed == nil {
		return engineNeedsManagedStart(f, d.url)
	}
	return d.managed.Check(f)
}
