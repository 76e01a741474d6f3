package daemon

import (
	"fmt"
	"strings"

	"github.com/Masterminds/semver/v3"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose/state"
)

// The project token (docs/project-token.md): a per-project secret in
// <state>/project-token that Compose gives the engine it manages as
// III_ENGINE_TOKEN, presents when it connects (Authorization: Bearer, which
// makes its connection admin: it registers compose::*, privileged, and
// calls engine::adapters::* and the adapter's worker::*) and still sends as
// `token` on engine::adapters::start, stop and restart, so that no worker
// (a VM worker least of all) can start a program on the host through the
// engine. It reaches no worker: worker environments are built from a fixed
// baseline, configurations never hold it, and the adapter leaves every .iii
// directory out of a VM. Attached to an engine it does not manage, Compose
// presents $III_ENGINE_TOKEN, else the user's ~/.iii/engine-token.

// codeAuthError is the engine's refusal of a connection whose bearer token
// it does not know.
const codeAuthError = "AUTH_ERROR"

// tokenSource is where the engine connection finds the token after the
// engine restarted: an engine Compose attached to (without
// $III_ENGINE_TOKEN) may have been restarted with a new
// ~/.iii/engine-token, which is read again; a managed engine keeps the
// project token, and an explicit $III_ENGINE_TOKEN is the operator's word.
func (d *Daemon) tokenSource() func() string {
	if d.managed != nil || d.tokenFromEnv {
		return nil
	}
	return func() string {
		tok, err := client.TokenFromFile(d.url)
		if err != nil {
			return ""
		}
		return tok
	}
}

// safeAdapterVersion is the first sandbox-libkrun that keeps .iii (and the
// token in it) out of every VM it boots.
const safeAdapterVersion = "0.3.1"

// withToken adds the engine token to an engine::adapters::* request when
// Compose has one: the project token of the engine it manages, or the
// operator's III_ENGINE_TOKEN for an engine it attaches to.
func (d *Daemon) withToken(req map[string]any) map[string]any {
	if d.token != "" {
		req["token"] = d.token
	}
	return req
}

// projectToken reads (or makes) the token of the project whose managed
// engine Compose is about to start. Before that engine learns it, the
// token is replaced when an adapter older than 0.3.1 ran a VM worker whose
// directory holds the compose file: that VM could read it, and its disk
// may keep the bytes. Updating or restarting the adapter keeps the token;
// only this start replaces it.
func (d *Daemon) projectToken(store *state.Store) (string, error) {
	runs, err := store.LoadVMRuns()
	if err != nil {
		return "", err
	}
	var exposed []state.VMRun
	for _, r := range runs.Runs {
		if r.HoldsComposeFile && olderThan(r.AdapterVersion, safeAdapterVersion) {
			exposed = append(exposed, r)
		}
	}
	if len(exposed) == 0 {
		tok, created, err := store.ProjectToken()
		if err != nil {
			return "", err
		}
		if created {
			d.log.Info("made the project token", "file", store.ProjectTokenPath())
		}
		return tok, nil
	}
	tok, err := store.ReplaceProjectToken()
	if err != nil {
		return "", err
	}
	var who []string
	for _, r := range exposed {
		v := r.AdapterVersion
		if v == "" {
			v = "of an unknown version"
		}
		who = append(who, fmt.Sprintf("%s %s ran VM worker %q from %s", r.Adapter, v, r.Container, r.HostDir))
	}
	if _, err := store.DropVMRuns(func(r state.VMRun) bool {
		return r.HoldsComposeFile && olderThan(r.AdapterVersion, safeAdapterVersion)
	}); err != nil {
		return "", err
	}
	d.log.Warn("replaced the project token", "file", store.ProjectTokenPath(), "why", strings.Join(who, "; "))
	fmt.Fprintf(d.out, "compose: replaced the project token (%s): %s, a directory that holds the compose file, and adapters before %s copy its .iii (the token among it) into the VM; the engine starts with the new token\n",
		store.ProjectTokenPath(), strings.Join(who, "; "), safeAdapterVersion)
	return tok, nil
}

// olderThan reports whether version is before min. A version Compose cannot
// read counts as older: keeping a token a VM may have read is the worse
// mistake.
func olderThan(version, min string) bool {
	v, err := semver.NewVersion(version)
	if err != nil {
		return true
	}
	return v.LessThan(semver.MustParse(min))
}

// withoutEngineToken is lookup with III_ENGINE_TOKEN unset. Compose reads
// the operator's token once, for its own engine::adapters::* calls; to
// everything else (the compose file's ${VAR} interpolation, env_file
// expansion, a worker's environment) the variable does not exist, so a
// file that writes `TOKEN: ${III_ENGINE_TOKEN}` cannot hand it to a worker.
func withoutEngineToken(lookup func(string) (string, bool)) func(string) (string, bool) {
	if lookup == nil {
		return nil
	}
	return func(k string) (string, bool) {
		if k == envEngineToken {
			return "", false
		}
		return lookup(k)
	}
}
