#!/usr/bin/env bash
# Installs what the test suite needs. Idempotent: a second run does nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

# The published Node SDK, pinned by the committed lockfile.
nodesdk="$root/testdata/nodesdk"
stamp="$nodesdk/node_modules/.installed-lock"
if ! cmp -s "$nodesdk/package-lock.json" "$stamp" 2>/dev/null; then
  echo "setup-test: installing the Node iii-sdk fixtures"
  (cd "$nodesdk" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  cp "$nodesdk/package-lock.json" "$stamp"
fi

# apt_install <command> <Debian package> <why>: installs the package when
# the command is missing.
apt_install() {
  local cmd="$1" pkg="$2" why="$3"
  command -v "$cmd" >/dev/null 2>&1 && return 0
  if command -v apt-get >/dev/null 2>&1; then
    local as_root=()
    [ "$(id -u)" -eq 0 ] || as_root=(sudo)
    echo "setup-test: installing $pkg"
    export DEBIAN_FRONTEND=noninteractive
    "${as_root[@]}" apt-get install -y -qq "$pkg" >/dev/null 2>&1 ||
      { "${as_root[@]}" apt-get update -qq && "${as_root[@]}" apt-get install -y -qq "$pkg" >/dev/null; }
  else
    echo "setup-test: $cmd is missing; install $pkg $why" >&2
  fi
}

# protoc, so the generated-code freshness test (contract/proto_test.go) runs
# rather than skips; the Go generators are pinned by scripts/proto.sh.
apt_install protoc protobuf-compiler "to run the generated-code freshness test"

# redis-server, which the iii-stream redis adapter's tests start on a free
# loopback port (host/stream/redis_test.go); they fail without it.
apt_install redis-server redis-server "to run the iii-stream redis adapter's tests"
