#!/usr/bin/env bash
# Regenerates the committed Go code generated from .proto files. Idempotent:
# the code generators are pinned and installed once into bin/tools/.
#
#   scripts/proto.sh              regenerate every target
#   scripts/proto.sh contract     regenerate one target
#   PROTO_OUT=DIR scripts/proto.sh contract
#                                 write the generated files into DIR instead
#                                 (the staleness test diffs DIR against the tree)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/bin/tools"

# Pinned generators. protoc-gen-go matches the google.golang.org/protobuf
# runtime in go.mod; bump both together.
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

# protoc comes from Debian (protobuf-compiler); its version is recorded in the
# generated headers.
ensure_protoc() {
  if command -v protoc >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "proto: installing protobuf-compiler" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q protobuf-compiler >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q protobuf-compiler >&2; }
    return
  fi
  echo "proto: protoc is missing; install Debian's protobuf-compiler package" >&2
  exit 1
}

# install_tool NAME PACKAGE VERSION installs NAME@VERSION into bin/tools
# unless that exact version is already there.
install_tool() {
  local name="$1" pkg="$2" version="$3" have=""
  if [ -x "$tools/$name" ]; then
    have="$("$tools/$name" --version 2>/dev/null | awk '{print $NF}')"
  fi
  if [ "$have" != "$version" ] && [ "v$have" != "$version" ]; then
    echo "proto: installing $name $version into bin/tools" >&2
    mkdir -p "$tools"
    GOBIN="$tools" go install "$pkg@$version"
  fi
}

ensure_generators() {
  ensure_protoc
  install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
  install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"
}

# gen_go PROTO_DIR FILE... generates Go and gRPC code for FILEs of PROTO_DIR
# next to them (or into $PROTO_OUT).
gen_go() {
  local dir="$1"
  shift
  local out="${PROTO_OUT:-$dir}"
  mkdir -p "$out"
  protoc -I "$dir" \
    --plugin=protoc-gen-go="$tools/protoc-gen-go" \
    --plugin=protoc-gen-go-grpc="$tools/protoc-gen-go-grpc" \
    --go_out="$out" --go_opt=paths=source_relative \
    --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
    "$@"
}

## target: contract — the sandbox contract service (contract/proto, package sandboxpb).
gen_contract() {
  gen_go "$root/contract/proto" sandbox.proto
}

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(contract)
fi
ensure_generators
for t in "${targets[@]}"; do
  case "$t" in
    contract) gen_contract ;;
    *) echo "proto: unknown target $t" >&2; exit 2 ;;
  esac
done
