#!/usr/bin/env bash
# P7 (engine): resident memory of an idle engine, beside the floor of an idle
# Go HTTP server that does nothing (the Go runtime's own cost).
#   scripts/bench/engine-rss.sh [bin/iii]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
iii="${1:-$root/bin/iii}"
work="$(mktemp -d)"
trap 'kill "${pid:-0}" "${fpid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT

port="${PORT:-49190}"
cat >"$work/config.yaml" <<YAML
workers:
  - name: iii-worker-manager
    config: { host: 127.0.0.1, port: $port }
  - name: configuration
    config: { adapter: { name: fs, config: { directory: ./config } } }
YAML
"$iii" -c "$work/config.yaml" >"$work/engine.log" 2>&1 &
pid=$!

mkdir -p "$work/floor"
cat >"$work/floor/main.go" <<'GO'
package main

import (
	"net"
	"net/http"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	_ = http.Serve(ln, http.NotFoundHandler())
}
GO
(cd "$work/floor" && go mod init floor >/dev/null 2>&1 && go build -o floor . )
"$work/floor/floor" &
fpid=$!

sleep 3
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
e=$(rss "$pid"); f=$(rss "$fpid")
awk -v e="$e" -v f="$f" 'BEGIN { printf "P7 engine idle RSS: %.1f MiB  floor (idle Go HTTP server): %.1f MiB  ratio %.2fx  goal <= 25 MiB\n", e/1024, f/1024, e/f }'
