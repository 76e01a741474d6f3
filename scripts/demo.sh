#!/usr/bin/env bash
# make demo: set up this machine (QEMU, a kernel, the python image), start an engine whose
# sandbox router is bound to sandbox-libkrun, start the adapter, run real Python in a real VM
# through `iii call sandbox::run`, print its stdout, and stop everything.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/bin"
"$root/scripts/setup.sh"

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

call() { "$bin/iii" call --port "$port" --timeout-ms 300000 "$@"; }

echo "demo: starting the sandbox-libkrun adapter in namespace default"
call engine::adapters::start --json "{\"adapter\":\"sandbox-libkrun\",\"namespace\":\"default\",\"path\":\"$bin/sandbox-libkrun\",
  \"config\":{\"image_allowlist\":[\"python\",\"node\"],\"state_dir\":\"$work/sandbox\"}}" | jq -c '{adapter, state, pid}'

echo "demo: iii call sandbox::run image=python lang=python code='print(2+2)'"
result="$(call sandbox::run image=python lang=python code='print(2+2)')"
echo "$result" | jq -c '{exit_code, success, duration_ms, stdout_truncated}'
echo "demo: the back end that ran it:"
call sandbox-libkrun::adapter::info | jq -c '{adapter, adapter_version, contract, hypervisor, accel, skipped}'
echo "demo: the sandbox printed:"
echo "$result" | jq -r .stdout
