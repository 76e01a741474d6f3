#!/usr/bin/env bash
# Sign a binary that runs libkrun VMs on macOS with the entitlements it
# needs (plugins/sandbox-libkrun/backend/libkrun/hvf-entitlements.plist), then
# check they are really there.
#
#   scripts/macos-sign.sh BINARY
#
# Environment:
#   CODESIGN_IDENTITY  signing identity; default "-" (ad-hoc)
#   ENTITLEMENTS       entitlements plist; default the one above
#   HARDENED=1         also turn on the hardened runtime (--options runtime)
#
# Run it after every build: `go build` signs darwin/arm64 binaries ad hoc
# with no entitlements, and any ad-hoc re-sign without --entitlements
# strips them. A binary without com.apple.security.hypervisor fails to start
# VMs with krun_start_enter returning -22 (EINVAL), which is easy to
# mistake for a configuration error. `go run` cannot be used for the same
# reason: it builds and runs an unsigned binary.
set -euo pipefail

usage() {
	echo "usage: $0 BINARY" >&2
	exit 2
}
[[ $# -eq 1 ]] || usage
bin=$1
[[ -f $bin ]] || { echo "macos-sign: $bin: no such file" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ent=${ENTITLEMENTS:-$here/../plugins/sandbox-libkrun/backend/libkrun/hvf-entitlements.plist}
[[ -f $ent ]] || { echo "macos-sign: entitlements $ent: no such file" >&2; exit 1; }
command -v codesign >/dev/null 2>&1 || {
	echo "macos-sign: codesign not found: this runs on macOS with the Xcode command line tools (xcode-select --install)" >&2
	exit 1
}

args=(--force --entitlements "$ent" --sign "${CODESIGN_IDENTITY:--}")
if [[ ${HARDENED:-0} == 1 ]]; then
	args+=(--options runtime)
fi
codesign "${args[@]}" "$bin"

# Verify: print the entitlements the binary now carries and require each
# key of the plist among them.
got=$(codesign -d --entitlements - "$bin" 2>&1) || {
	echo "macos-sign: codesign -d failed for $bin:" >&2
	echo "$got" >&2
	exit 1
}
missing=0
for key in $(sed -n 's|.*<key>\(com\.apple\.[^<]*\)</key>.*|\1|p' "$ent"); do
	if ! grep -qF "$key" <<<"$got"; then
		echo "macos-sign: $bin lacks $key after signing" >&2
		missing=1
	fi
done
[[ $missing == 0 ]] || exit 1
echo "macos-sign: $bin signed with $(basename "$ent")"
