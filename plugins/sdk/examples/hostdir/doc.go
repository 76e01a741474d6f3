// Package hostdir is an example sandbox adapter built only with the public
// SDK (sdk, sandboxkit, contract): each sandbox is a private directory on
// the host and each exec a host process.
//
// ┌────────────────────────────────────────────────────────────────────┐
// │ WARNING: sandbox-hostdir provides NO ISOLATION WHATSOEVER.         │
// │ Code run in its "sandboxes" runs as the adapter's own user, with   │
// │ that user's files, network and processes in reach. The sandbox     │
// │ directory only gives paths a convenient root. Use it for adapter   │
// │ development and tests, NEVER for code you do not trust.            │
// │ adapter::info reports isolation: "none".                           │
// └────────────────────────────────────────────────────────────────────┘
//
// # Layout
//
// Each sandbox is a directory <state>/<sandbox_id>/ with mode 0700, where
// <state> is the state_dir configuration key, else $III_STATE_DIR, else
// ~/.iii/sandbox/hostdir. It starts with home/ and tmp/ and is removed,
// with everything in it, when the sandbox stops.
//
// # Path mapping
//
// Filesystem operations take sandbox paths: "/" is the sandbox directory,
// and os.Root confines every operation to it (".." and symbolic links
// cannot lead out; such attempts are S215). Relative paths are relative to
// /home.
//
// An exec is a host process, so it sees host paths. The adapter maps:
//
//   - the working directory: a sandbox path (default /home), always;
//   - each argument that is an absolute path whose first component exists
//     in the sandbox directory (by default /home and /tmp, plus any
//     top-level directory created with fs operations): rewritten to its
//     place under the sandbox directory, so "python3 /tmp/run.py" runs
//     the file sandbox::run wrote;
//   - HOME and TMPDIR: the sandbox's home/ and tmp/;
//   - III_SANDBOX_ROOT: the sandbox directory, for scripts that need a
//     host path themselves.
//
// Nothing else is rewritten: other absolute arguments (/bin/sh,
// /usr/bin/python3) are the host's, and paths inside scripts, "-c"
// strings, "--opt=/path" forms and environment values are passed as they
// are. Use relative paths in code run in a hostdir sandbox.
//
// # Presets
//
// python (the host's python3), node (the host's node) and shell (the
// host's /bin/sh). Creating a sandbox checks the program is there (S101
// otherwise). A custom image must have the reference "host:<program>".
// cpus, memory_mb and network are accepted and ignored: every process
// gets the host's resources and network.
//
// # Processes
//
// Each exec runs in its own process group, which is killed on timeout.
// Stopping a sandbox kills the process group of every exec it ran
// (including processes left running in the background) and, on Linux,
// any other process whose working directory is inside the sandbox.
package hostdir
