#!/usr/bin/env bash
# Pre-download the Go modules the interop tests need (tests/interop): clone the
# Go reference's git bundle, make a build copy of interop/go with a `replace`
# pointing at the clone, and `go mod download` there. Idempotent (the module
# cache keeps what it has); exits non-zero without Go or the bundle, and the
# interop tests then skip with the reason.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle="${BRMCP_GO_REFERENCE:-../shared/go-reference/brmcp.bundle}"
command -v go >/dev/null || { echo "go-reference: no Go toolchain" >&2; exit 1; }
[ -f "$bundle" ] || { echo "go-reference: no bundle at $bundle" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone --quiet --no-checkout "$bundle" "$work/src"
commit=$(sed -n 's|^\s*github.com/karamble/brmcp v.*-\([0-9a-f]\{12\}\)$|\1|p' interop/go/go.mod)
git -C "$work/src" -c advice.detachedHead=false checkout --quiet "$commit"
mkdir "$work/build"
cp interop/go/*.go interop/go/go.mod interop/go/go.sum "$work/build/"
cd "$work/build"
go mod edit -replace "github.com/karamble/brmcp=$work/src"
GOFLAGS=-mod=mod go mod download all
echo "go-reference: modules for interop/go are in $(go env GOMODCACHE)"
