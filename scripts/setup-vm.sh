#!/usr/bin/env bash
# Installs what sandbox VMs need on the QEMU back end: the QEMU system
# emulator for this machine's architecture, a Debian kernel whose virtio
# drivers are modules (the guest agent loads them), busybox-static (test
# images) and erofs-utils (read-only image filesystems).
#
# Idempotent: installs only what is missing and says what it installed.
# Runs as root, or through sudo when that is available.
set -euo pipefail

case "$(uname -s)" in
  Linux) ;;
  Darwin)
    echo "setup-vm: on macOS install QEMU with your package manager (it provides qemu-system-aarch64 with hvf);" >&2
    echo "setup-vm: the guest kernel and images are built on Linux." >&2
    exit 1
    ;;
  *)
    echo "setup-vm: unsupported OS $(uname -s)" >&2
    exit 1
    ;;
esac

case "$(uname -m)" in
  x86_64) pkgs=(qemu-system-x86 linux-image-cloud-amd64 busybox-static erofs-utils) ;;
  aarch64 | arm64) pkgs=(qemu-system-arm linux-image-arm64 busybox-static erofs-utils) ;;
  *)
    echo "setup-vm: unsupported architecture $(uname -m): sandbox VMs run on x86_64 and arm64" >&2
    exit 1
    ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-vm: this script installs Debian packages (${pkgs[*]}) and needs apt-get;" >&2
  echo "setup-vm: on another distribution install the equivalents by hand." >&2
  exit 1
fi

missing=()
for p in "${pkgs[@]}"; do
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "setup-vm: missing packages ${missing[*]}; run this script as root (sudo is not installed)" >&2
    exit 1
  fi
fi

echo "setup-vm: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
# No recommends: qemu-system-x86's (its GUI, OVMF, qemu-utils, block drivers) and the kernel's
# (firmware, apparmor) are ~340 packages and ~250 MB a sandbox never uses (TCG or KVM boots with
# -kernel, on virtio disks).
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup-vm: installed ${missing[*]}"
