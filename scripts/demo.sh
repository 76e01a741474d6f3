#!/usr/bin/env bash
# make demo: build what it runs (iii, sandbox-libkrun, the guest agent), set up this machine (QEMU,
# a kernel, the python image: only the image it runs), start an engine whose sandbox router is
# bound to sandbox-libkrun, start the adapter, run real Python in a real VM through
# `iii call sandbox::run`, print its stdout, and stop everything. Ends with how long each stage
# took. III_DEMO_IMAGES picks other presets to build too (make setup builds them all);
# III_DEMO_BIN builds and runs the binaries in another directory than bin/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${III_DEMO_BIN:-$root/bin}"

# Stage timings, printed at the end: stage NAME ends the running stage.
stage_names=()
stage_secs=()
stage_mark=$EPOCHREALTIME
demo_start=$stage_mark
stage() {
  local now=$EPOCHREALTIME
  stage_names+=("$1")
  stage_secs+=("$(awk -v a="$stage_mark" -v b="$now" 'BEGIN { printf "%.1f", b - a }')")
  stage_mark=$now
}
timings() {
  echo "demo: stage timings"
  local i
  for i in "${!stage_names[@]}"; do
    printf '  %-22s %7s s\n' "${stage_names[$i]}" "${stage_secs[$i]}"
  done
  printf '  %-22s %7s s\n' total "$(awk -v a="$demo_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"
}

# The Go build (CPU) and the tools' apt installs (mostly the network) do not
# depend on each other: on a fresh machine they overlap (about 55 s of apt,
# BENCHMARKS.md D1). Setup runs in the background only where it cannot ask
# for a password (root, or sudo without one); its output is shown after the
# build.
if [ "$(id -u)" -eq 0 ] || sudo -n true 2>/dev/null; then
  setup_log="$(mktemp /tmp/iii-demo-setup.XXXXXX)"
  setup_start=$EPOCHREALTIME
  ( "$root/scripts/setup.sh" -images "" >"$setup_log" 2>&1; echo "$EPOCHREALTIME" >"$setup_log.end" ) &
  setup_pid=$!
  build_rc=0
  "${MAKE:-make}" -s -C "$root" build-sandbox BIN="$bin" || build_rc=$?
  stage "build binaries"
  setup_rc=0
  wait "$setup_pid" || setup_rc=$?
  cat "$setup_log"
  setup_end="$(cat "$setup_log.end" 2>/dev/null || echo "$EPOCHREALTIME")"
  rm -f "$setup_log" "$setup_log.end"
  [ "$build_rc" -eq 0 ] || { echo "demo: building the binaries failed" >&2; exit "$build_rc"; }
  [ "$setup_rc" -eq 0 ] || { echo "demo: setting up the tools failed (its output is above)" >&2; exit "$setup_rc"; }
  stage "setup tools (waited)"
  echo "demo: the tools' setup took $(awk -v a="$setup_start" -v b="$setup_end" 'BEGIN { printf "%.1f", b - a }') s, beside the build"
else
  "$root/scripts/setup.sh" -images ""
  stage "setup tools"
  "${MAKE:-make}" -s -C "$root" build-sandbox BIN="$bin"
  stage "build binaries"
fi
"$root/scripts/setup.sh" -images "${III_DEMO_IMAGES:-python}"
stage "image build"

work="$(mktemp -d /tmp/iii-demo.XXXXXX)"
port="${III_DEMO_PORT:-49134}"
engine_pid=""
cleanup() {
  if [ -n "$engine_pid" ] && kill -0 "$engine_pid" 2>/dev/null; then
    kill -TERM "$engine_pid" 2>/dev/null || true
    wait "$engine_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/config.yaml" <<YAML
workers:
  - name: iii-worker-manager
    config: { host: 127.0.0.1, port: $port }
  - name: configuration
    config: { adapter: { name: fs, config: { directory: ./config } } }
sandbox:
  adapter: sandbox-libkrun
  namespace: default
YAML

echo "demo: starting the engine on ws://127.0.0.1:$port"
"$bin/iii" -c "$work/config.yaml" >"$work/engine.log" 2>&1 &
engine_pid=$!
for _ in $(seq 1 100); do
  if "$bin/iii" call --port "$port" engine::workers::list >/dev/null 2>&1; then break; fi
  if ! kill -0 "$engine_pid" 2>/dev/null; then cat "$work/engine.log" >&2; exit 1; fi
  sleep 0.1
done
stage "engine start"

call() { "$bin/iii" call --port "$port" --timeout-ms 300000 "$@"; }

echo "demo: starting the sandbox-libkrun adapter in namespace default"
call engine::adapters::start --json "{\"adapter\":\"sandbox-libkrun\",\"namespace\":\"default\",\"path\":\"$bin/sandbox-libkrun\",
  \"config\":{\"image_allowlist\":[\"python\",\"node\"],\"state_dir\":\"$work/sandbox\"}}" | jq -c '{adapter, state, pid}'
stage "adapter start"

echo "demo: iii call sandbox::run image=python lang=python code='print(2+2)'"
result="$(call sandbox::run image=python lang=python code='print(2+2)')"
stage "the run"
echo "$result" | jq -c '{exit_code, success, duration_ms, stdout_truncated}'
echo "demo: the back end that ran it:"
call sandbox-libkrun::adapter::info | jq -c '{adapter, adapter_version, contract, hypervisor, accel, skipped}'
echo "demo: the sandbox printed:"
echo "$result" | jq -r .stdout
timings
