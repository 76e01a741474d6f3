#!/usr/bin/env bash
# D1 (BENCHMARKS.md): make demo's first run on this machine, timed with a fresh image cache,
# beside a floor from the same run: the demo's own .deb files downloaded again the way the
# builder downloads them (4 apt-get processes), plus a cold VM boot (the P4 floor, an argument:
# -boot-s, default 1.7 s measured by `go run ./scripts/bench/sandbox`).
#
# The demo runs with HOME in a scratch directory, so the image builder's layout and .deb cache,
# the image store, the binaries (III_DEMO_BIN) and Go's module and build caches are all fresh, as
# on a fresh clone (-warm-go keeps this machine's Go caches); the shared ~/.iii/cache is never
# touched. What it cannot redo: the apt installs of QEMU and the kernel (already on this machine:
# setup-vm.sh finds them). Prints the demo's stage table, then the figure, the floor and the ratio.
#
# Usage: scripts/bench/firstrun.sh [-boot-s SECONDS] [-warm-go]   (as root: the builder's chroot check)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
boot_s=1.7
warm_go=false
while [ $# -gt 0 ]; do
  case "$1" in
    -boot-s)
      [ $# -ge 2 ] || { echo "firstrun: -boot-s needs a value" >&2; exit 2; }
      boot_s="$2"
      shift 2
      ;;
    -warm-go)
      warm_go=true
      shift
      ;;
    *) echo "firstrun: unknown argument $1 (usage: scripts/bench/firstrun.sh [-boot-s SECONDS] [-warm-go])" >&2; exit 2 ;;
  esac
done

scratch="$(mktemp -d /tmp/iii-firstrun.XXXXXX)"
# Go's module cache is read-only: make it writable to remove it.
trap 'chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"' EXIT
mkdir -p "$scratch/home"
goenv=(GOCACHE="$scratch/home/.cache/go-build" GOMODCACHE="$scratch/home/go/pkg/mod" GOPATH="$scratch/home/go")
if $warm_go; then
  goenv=(GOCACHE="$(go env GOCACHE)" GOMODCACHE="$(go env GOMODCACHE)" GOPATH="$(go env GOPATH)")
fi
echo "firstrun: load average before: $(cut -d' ' -f1-3 /proc/loadavg); Go caches: $($warm_go && echo warm || echo fresh)"
env HOME="$scratch/home" "${goenv[@]}" III_DEMO_BIN="$scratch/bin" III_DEMO_PORT="${III_DEMO_PORT:-49179}" \
  "$root/scripts/demo.sh" | tee "$scratch/demo.log"
echo "firstrun: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
figure="$(awk '$1 == "total" { print $2 }' "$scratch/demo.log")"
grep -qx 4 "$scratch/demo.log" || { echo "firstrun: the demo did not print 4" >&2; exit 1; }

# The floor's downloads: the same package versions, fetched again into a scratch directory.
debs="$scratch/home/.iii/cache/imagebuild/debs"
mapfile -t pkgs < <(find "$debs" -maxdepth 1 -name '*.deb' -printf '%f\n' |
  awk -F_ '{ v = $2; gsub(/%3a/, ":", v); print $1 "=" v }')
[ "${#pkgs[@]}" -gt 0 ] || { echo "firstrun: no .deb files in $debs" >&2; exit 1; }
bytes="$(du -sb "$debs" | cut -f1)"
start=$EPOCHREALTIME
pids=()
for i in 0 1 2 3; do
  mkdir -p "$scratch/dl/$i"
  part=()
  for ((j = i; j < ${#pkgs[@]}; j += 4)); do part+=("${pkgs[$j]}"); done
  (cd "$scratch/dl/$i" && apt-get -q -o Debug::NoLocking=1 -o APT::Sandbox::User=root download "${part[@]}" >/dev/null) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
dl_s="$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')"

awk -v fig="$figure" -v dl="$dl_s" -v boot="$boot_s" -v bytes="$bytes" -v n="${#pkgs[@]}" 'BEGIN {
  floor = dl + boot
  printf "D1 first run (make demo, fresh image cache): %.1f s\n", fig
  printf "   floor: download of the same %d .debs (%.1f MB) %.1f s (%.1f MB/s) + cold VM boot %.1f s = %.1f s\n", n, bytes / 1e6, dl, bytes / 1e6 / dl, boot, floor
  printf "   ratio: %.1fx\n", fig / floor
}'
