#!/usr/bin/env bash
# Runs every benchmark harness; each prints its figure beside the floor
# measured in the same run and the ratio. BENCHMARKS.md records the latest
# results and how to reproduce each one (its "Reproduce" column names the
# harness of every row).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
failed=()
for h in scripts/bench/*/; do
  name="$(basename "$h")"
  echo "== $name"
  go run "./$h" || { echo "bench $name failed" >&2; failed+=("$name"); }
done
echo "== engine-rss"
scripts/bench/engine-rss.sh "$root/bin/iii" || failed+=(engine-rss)
echo "== go benchmarks (N1, BenchmarkAllowed)"
scripts/bench/gobench.sh || failed+=(gobench)
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
