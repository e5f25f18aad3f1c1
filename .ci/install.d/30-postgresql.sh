#!/usr/bin/env bash
# A PostgreSQL server for the PostgreSQL store tests (tests/kit/postgres.py
# starts its own with initdb + pg_ctl on a Unix socket in a temp dir).
# Idempotent: does nothing when initdb is already on PATH or under
# /usr/lib/postgresql/*/bin.
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "postgresql: initdb present"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "postgresql: no apt-get here; the PostgreSQL store tests will skip" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "postgresql: not root and no sudo; the PostgreSQL store tests will skip" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
# The Debian package starts a cluster of its own; the tests never use it.
$SUDO apt-get install -y --no-install-recommends postgresql
ls /usr/lib/postgresql/*/bin/initdb
