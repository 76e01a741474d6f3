#!/usr/bin/env bash
# Runs the golangci-lint pinned in tools/lint/go.mod over the main module,
# with the checks in .golangci.yml (make vet runs it).
#   tools/lint/run.sh [golangci-lint run flags]...
# The linter lives in a module of its own so its dependencies never enter the
# main module's go.mod and go.sum. It is built once into a cache directory
# ($III_TOOLS_CACHE, default ~/.cache/iii-tools) under a name taken from the
# contents of tools/lint/go.mod and go.sum: a changed pin builds a new binary,
# an unchanged one is reused. Only the first build fetches modules; later runs,
# and a rebuild from the module cache, work offline.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${III_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iii-tools}"
pin="$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)"
bin="$cache/golangci-lint-$pin"
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  echo "lint: building golangci-lint (tools/lint/go.mod) into $bin" >&2
  # Built under a temporary name and renamed, so an interrupted build never
  # leaves a half-written binary that a later run would trust.
  tmp="$(mktemp "$cache/.golangci-lint.XXXXXX")"
  trap 'rm -f "$tmp"' EXIT
  (cd "$here" && go build -o "$tmp" github.com/golangci/golangci-lint/v2/cmd/golangci-lint)
  mv -f "$tmp" "$bin"
  trap - EXIT
fi
cd "$root"
exec "$bin" run "$@"
