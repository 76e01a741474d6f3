#!/usr/bin/env bash
# Runs every fuzz target in the module for a short while (FUZZTIME, default 10s).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
fuzztime="${FUZZTIME:-10s}"
fail=0
while IFS= read -r pkg; do
  dir="$(go list -f '{{.Dir}}' "$pkg")"
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "== $pkg $target"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" || fail=1
  done
done < <(go list ./...)
exit "$fail"
