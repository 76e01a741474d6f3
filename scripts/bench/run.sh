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
# The rows whose harness needs other flags than the loop's bare run: T4-T6
# (sandbox::pause and resume), P6 (exec round trips), T7w (worker VMs adopted; the adopt harness
# adopts none by default) and D1 (the first make demo, with Go's caches kept
# warm so it measures the demo, not a cold Go build).
echo "== sandbox -pause (T4-T6)"
go run ./scripts/bench/sandbox -pause || { echo "bench sandbox -pause failed" >&2; failed+=(sandbox-pause); }
echo "== sandbox -exec (P6)"
go run ./scripts/bench/sandbox -exec || { echo "bench sandbox -exec failed" >&2; failed+=(sandbox-exec); }
echo "== adopt -n 1 -workers 1 (T7w)"
go run ./scripts/bench/adopt -n 1 -workers 1 || { echo "bench adopt -workers failed" >&2; failed+=(adopt-workers); }
echo "== firstrun -warm-go (D1)"
scripts/bench/firstrun.sh -warm-go || failed+=(firstrun)
echo "== engine-rss"
scripts/bench/engine-rss.sh "$root/bin/iii" || failed+=(engine-rss)
echo "== go benchmarks (N1, BenchmarkAllowed)"
scripts/bench/gobench.sh allowed n1 || failed+=(gobench)
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
