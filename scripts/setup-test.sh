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
