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

# protoc, so the generated-code freshness test (contract/proto_test.go) runs
# rather than skips; the Go generators are pinned by scripts/proto.sh.
if ! command -v protoc >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    as_root=()
    [ "$(id -u)" -eq 0 ] || as_root=(sudo)
    echo "setup-test: installing protobuf-compiler"
    export DEBIAN_FRONTEND=noninteractive
    "${as_root[@]}" apt-get install -y -qq protobuf-compiler >/dev/null 2>&1 ||
      { "${as_root[@]}" apt-get update -qq && "${as_root[@]}" apt-get install -y -qq protobuf-compiler >/dev/null; }
  else
    echo "setup-test: protoc is missing; install protobuf-compiler to run the generated-code freshness test" >&2
  fi
fi
