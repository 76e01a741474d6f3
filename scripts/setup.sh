#!/usr/bin/env bash
# Sets up a machine to run sandboxes: the VM tools (QEMU, a Debian kernel, erofs-utils), jq for the
# demo, and the preset images (python, node) built from Debian packages into the local image store.
# Idempotent: a second run installs and builds nothing.
#
# Usage: scripts/setup.sh [-images LIST]
#   -images LIST  the presets to build, comma-separated (default python,node; empty: tools only).
#                 make demo builds only python, the image it runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
images="python,node"
while [ $# -gt 0 ]; do
  case "$1" in
    -images)
      [ $# -ge 2 ] || { echo "setup: -images needs a value" >&2; exit 2; }
      images="$2"
      shift 2
      ;;
    *)
      echo "setup: unknown argument $1 (usage: scripts/setup.sh [-images LIST])" >&2
      exit 2
      ;;
  esac
done
"$root/scripts/setup-vm.sh"
if ! command -v jq >/dev/null 2>&1; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  echo "setup: installing jq"
  "${as_root[@]}" apt-get update -qq && "${as_root[@]}" apt-get install -y -qq jq >/dev/null
fi
if [ -n "$images" ]; then
  "$root/scripts/build-images.sh" -q -images "$images"
fi
