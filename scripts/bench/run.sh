#!/usr/bin/env bash
# Runs every benchmark harness; each prints its figure beside the floor
# measured in the same run and the ratio. BENCHMARKS.md records the latest
# results and how to reproduce each one.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
for h in scripts/bench/*/; do
  name="$(basename "$h")"
  echo "== $name"
  go run "./$h" || echo "bench $name failed" >&2
done
echo "== engine-rss"
scripts/bench/engine-rss.sh "$root/bin/iii"
