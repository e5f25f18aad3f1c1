#!/usr/bin/env bash
# Pre-download the Go modules of brnet (interop/brnet: a real Bison Relay relay
# and clients for the real-network tests) and build it into brmcp's cache, so
# the tests do not spend their time on it. Idempotent: Go's module and build
# caches make a second run cheap. Without Go this does nothing; the tests that
# need brnet then skip with a reason.
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! command -v go >/dev/null 2>&1; then
    echo "go-modules: Go not found; real-network tests will skip" >&2
    exit 0
fi
(cd interop/brnet && go mod download) || { echo "go-modules: go mod download failed" >&2; exit 1; }
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if "$PY" -c "import brmcp" >/dev/null 2>&1; then
    "$PY" -c "from brmcp.testing.brnet import brnet_binary; print('go-modules: brnet built at', brnet_binary())"
else
    (cd interop/brnet && go build -tags noaudio -buildvcs=false -trimpath -o /dev/null .)
fi
