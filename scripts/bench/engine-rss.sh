#!/usr/bin/env bash
# P7 (engine): resident memory of an idle engine, beside the floor of an idle
# Go HTTP server that does nothing (the Go runtime's own cost), both started
# in this run. Each is sampled once it is ready (the engine logged "engine
# started" and accepts on its port; the floor printed its address) and idle
# (no CPU time used over 200 ms), never after a fixed sleep.
#   scripts/bench/engine-rss.sh [bin/iii]
# Prints VmRSS and its two parts: anonymous (the process's own heap, stacks
# and data) and file-backed (pages of the binary and libc mapped from the
# page cache, shared with every process that maps the same file).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
iii="${1:-$root/bin/iii}"
work="$(mktemp -d)"
trap 'kill "${pid:-0}" "${fpid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

# until CMD... retries CMD every 20 ms for at most 30 s.
until_ok() {
  local i
  for ((i = 0; i < 1500; i++)); do
    if "$@"; then return 0; fi
    sleep 0.02
  done
  echo "engine-rss: timed out waiting for: $*" >&2
  return 1
}
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# idle PID: no CPU time (clock ticks) used over 200 ms.
idle() {
  local a b
  a=$(cpu "$1"); sleep 0.2; b=$(cpu "$1")
  [ "$a" = "$b" ]
}
alive() { kill -0 "$1" 2>/dev/null || { echo "engine-rss: process $1 exited; see its log" >&2; cat "$work"/*.log >&2; exit 1; }; }
started() { alive "$pid"; grep -q 'engine started' "$work/engine.log" && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }
floor_ready() { alive "$fpid"; [ -s "$work/floor.log" ]; }

port="${PORT:-49190}"
cat >"$work/config.yaml" <<YAML
workers:
  - name: iii-worker-manager
    config: { host: 127.0.0.1, port: $port }
  - name: configuration
    config: { adapter: { name: fs, config: { directory: ./config } } }
YAML

mkdir -p "$work/floor"
cat >"$work/floor/main.go" <<'GO'
package main

import (
	"fmt"
	"net"
	"net/http"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(ln.Addr())
	_ = http.Serve(ln, http.NotFoundHandler())
}
GO
(cd "$work/floor" && go mod init floor >/dev/null 2>&1 && go build -o floor .)

(cd "$work" && exec "$iii" -c "$work/config.yaml" >"$work/engine.log" 2>&1) &
pid=$!
"$work/floor/floor" >"$work/floor.log" 2>&1 &
fpid=$!

until_ok started
until_ok floor_ready
faddr=$(head -1 "$work/floor.log")
until_ok idle "$pid"
until_ok idle "$fpid"

kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
e=$(kib "$pid" VmRSS); ea=$(kib "$pid" RssAnon); ef=$(kib "$pid" RssFile)
f=$(kib "$fpid" VmRSS); fa=$(kib "$fpid" RssAnon); ff=$(kib "$fpid" RssFile)

# The same after use: 20 calls to the engine (each a new client: connect,
# call, close) and 20 requests to the floor, then idle again for 10 s, so
# the pages serving calls and the engine's timers are resident again.
for ((i = 0; i < 20; i++)); do
  "$iii" call --address 127.0.0.1 --port "$port" engine::functions::list >/dev/null
  (exec 3<>"/dev/tcp/127.0.0.1/${faddr##*:}"; printf 'GET / HTTP/1.0\r\n\r\n' >&3; cat <&3 >/dev/null)
done
sleep 10
until_ok idle "$pid"
until_ok idle "$fpid"
e2=$(kib "$pid" VmRSS); ef2=$(kib "$pid" RssFile); f2=$(kib "$fpid" VmRSS)

load=$(cut -d' ' -f1-3 /proc/loadavg)
ebin=$(stat -c %s "$iii"); fbin=$(stat -c %s "$work/floor/floor")
awk -v e="$e" -v ea="$ea" -v ef="$ef" -v f="$f" -v fa="$fa" -v ff="$ff" -v load="$load" -v e2="$e2" -v ef2="$ef2" -v f2="$f2" -v eb="$ebin" -v fb="$fbin" 'BEGIN {
  printf "P7 engine idle RSS: %.1f MiB (anon %.1f, file %.1f; binary %.1f MB)\n", e/1024, ea/1024, ef/1024, eb/1e6
  printf "   floor (idle Go HTTP server, same run): %.1f MiB (anon %.1f, file %.1f; binary %.1f MB)\n", f/1024, fa/1024, ff/1024, fb/1e6
  printf "   ratio RSS %.2fx, anon %.2fx, file %.2fx  goal RSS <= 2x  load average %s\n", e/f, ea/fa, ef/ff, load
  printf "P7 after 20 calls and 10 s idle: engine %.1f MiB (file %.1f), floor %.1f MiB, ratio %.2fx\n", e2/1024, ef2/1024, f2/1024, e2/f2
}'
