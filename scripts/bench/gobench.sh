#!/usr/bin/env bash
# The figures BENCHMARKS.md takes from Go benchmarks, each printed beside its
# floor from the same run and the ratio:
#   N1   guest network through usernet vs QEMU's slirp, same VM (boots VMs)
#   P1s  BenchmarkAllowed, the RBAC decision alone, vs the P1 round trip it
#        sits on (go run ./scripts/bench/wsroundtrip prints that)
#   scripts/bench/gobench.sh [n1|allowed]...   (default: both)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
which=("$@")
[ ${#which[@]} -gt 0 ] || which=(allowed n1)
load() { cut -d' ' -f1-3 /proc/loadavg; }

for w in "${which[@]}"; do
  case "$w" in
  allowed)
    echo "P1s: BenchmarkAllowed (load average $(load))"
    go test -run '^$' -bench '^BenchmarkAllowed$' -benchtime 2s -count 3 ./internal/rbac |
      awk '/^BenchmarkAllowed/ { print $3 }' | sort -n |
      awk '{ v[++n] = $1 } END {
        if (n == 0) { print "  no result" > "/dev/stderr"; exit 1 }
        printf "  RBAC decision: %.1f ns/op (median of %d runs); compare with P1 p50 in wsroundtrip\n", v[int((n+1)/2)], n }'
    ;;
  n1)
    echo "N1: guest network, usernet vs slirp (load average $(load))"
    go test -run '^$' -bench '^BenchmarkGuestNetwork$' -timeout 30m ./plugins/sandbox-libkrun/backend/qemu |
      tee /dev/stderr |
      awk '/^BenchmarkGuestNetwork\// {
          split($1, p, "/"); sub(/-[0-9]+$/, "", p[3])
          ns[p[2] "/" p[3]] = $3
          for (i = 4; i <= NF; i++) if ($(i) == "MB/s") mbs[p[2] "/" p[3]] = $(i-1)
        }
        END {
          if (!("usernet/download" in mbs) || !("slirp/download" in mbs)) { print "  no result (needs QEMU and the test kernel)" > "/dev/stderr"; exit 1 }
          printf "  download: usernet %.1f MB/s, slirp (floor) %.1f MB/s, ratio %.2fx\n", mbs["usernet/download"], mbs["slirp/download"], mbs["usernet/download"] / mbs["slirp/download"]
          printf "  one fetch: usernet %.2f ms, slirp (floor) %.2f ms, ratio %.2fx\n", ns["usernet/connect"] / 1e6, ns["slirp/connect"] / 1e6, ns["usernet/connect"] / ns["slirp/connect"]
        }'
    ;;
  *) echo "gobench: unknown benchmark $w (n1, allowed)" >&2; exit 2 ;;
  esac
done
