#!/usr/bin/env bash
# Sets up a machine to run sandboxes: the VM tools (QEMU, a Debian kernel, erofs-utils), jq for the
# demo, and the preset images (python, node) built from Debian packages into the local image store.
# Idempotent: a second run installs and builds nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup-vm.sh"
if ! command -v jq >/dev/null 2>&1; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  echo "setup: installing jq"
  "${as_root[@]}" apt-get update -qq && "${as_root[@]}" apt-get install -y -qq jq >/dev/null
fi
"$root/scripts/build-images.sh" -q
