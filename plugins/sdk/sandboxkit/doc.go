// Package sandboxkit implements the sandbox contract's semantics once, so
// that every adapter built on it behaves the same way. An adapter supplies
// a Provider (boot a sandbox; exec and file operations inside one; stop
// it) and New wraps it in a Manager, which is a complete contract.Adapter:
//
//   - configuration (spec §7.3) parsed fail-closed: every key and type is
//     checked, unknown keys and the legacy {sandbox: {...}} shape are
//     refused, the provider's own keys are handed to it;
//   - the catalog: the provider's presets in order, then custom_images
//     sorted; python, node, bash and alpine are reserved; image_allowlist
//     is fail-closed (S100 lists the allowed names);
//   - create: max_concurrent_sandboxes (S400), the allowlist (S100),
//     per_image_caps (S400), defaults, UUID v4 ids;
//   - exec: S002 unknown, S004 stopped or reaped, S003 at the exec cap
//     (0 means 1, no queueing), timeouts clamped to max_exec_timeout_ms,
//     S200 on timeout, output capped at 1 MiB per stream with the 1.1
//     truncation flags;
//   - run: the lang mapping, files then code, the sandbox stopped on
//     success and failure unless keep_sandbox, failures wrapped with
//     contract.WrapRunStep;
//   - list, stop (S004 when already stopped; wait), recently stopped
//     sandboxes kept for an hour so callers get S004 rather than S002;
//   - the idle reaper (every reaper_tick_ms, default 10 s), and sandboxes
//     that die on their own marked stopped;
//   - Shutdown, which stops every sandbox.
//
// Package fsops implements the ten filesystem operations on a directory
// for providers whose sandbox files are reachable as one.
package sandboxkit
