#!/usr/bin/env bash
# Builds the sandbox preset images (python, node) from Debian packages and
# installs them into the local OCI layout (~/.iii/cache/oci), named
# docker.io/iiidev/python:latest and docker.io/iiidev/node:latest, so the
# image store finds them with no registry access.
#
# Idempotent: a second run with unchanged inputs (recipes, apt package
# lists, cached .debs) changes nothing and takes about a second. A failed
# package download (stale lists) runs apt-get update and builds once more.
#
# Usage: scripts/build-images.sh [-images python,node] [-layout DIR]
#        [-cache DIR] [-check=false] [-force] [-q]
# As root it also runs python3 / node in a chroot of each image (-check).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

for tool in apt-get dpkg-deb go; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-images: $tool is required (a Debian or Ubuntu host with Go)" >&2
    exit 1
  fi
done

apt_update() {
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -q
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get update -q
  else
    echo "build-images: run 'apt-get update' as root first" >&2
    exit 1
  fi
}

# The closure is resolved from this host's package lists; fetch them once
# if this machine never ran apt-get update.
if ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then
  echo "build-images: no apt package lists; running apt-get update"
  apt_update
fi

cd "$root"
# Lists older than the mirror name versions it no longer serves: when a
# download fails, refresh the lists once and build again.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
# -trimpath as make's builds: the builder then reuses the packages they
# compiled (on a fresh clone, without it, about 35 s of CPU compiling the
# standard library and shared modules again; BENCHMARKS.md D1).
go run -trimpath ./scripts/imagebuild "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ] && grep -q "apt-get download:" "$log"; then
  echo "build-images: a package download failed; running apt-get update and retrying"
  apt_update
  go run -trimpath ./scripts/imagebuild "$@"
  exit
fi
exit "$rc"
