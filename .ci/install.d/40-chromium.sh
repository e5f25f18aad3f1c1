#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the approvals-page browser tests
# (tests/bridge/test_ui_browser.py). Idempotent: does nothing when both are present.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    echo "chromium: $(chromium --version 2>/dev/null | head -1); chromedriver present"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium: no apt-get here; the browser tests will skip" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "chromium: not root and no sudo; the browser tests will skip" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium chromium-driver
chromium --version || true
