#!/usr/bin/env bash
# Install mcp-proxy (PyPI), the maintained stdio <-> streamable-HTTP proxy that
# lets a stdio-only MCP client (Claude Desktop and the like) reach a brmcp-bridge
# endpoint (README.md, "Stdio-only agents"). mcp-proxy 0.13 needs the MCP SDK 1.x
# while brmcp uses 2.x, so it gets its own virtual environment in
# .tools/mcp-proxy, as `pipx install mcp-proxy` or `uv tool install mcp-proxy`
# would give a user. Idempotent; without it tests/commands/test_mcp_proxy.py skips.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=0.13.0
dir=.tools/mcp-proxy
if [ -x "$dir/bin/mcp-proxy" ] && "$dir/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('mcp-proxy') != '$VERSION')" 2>/dev/null; then
    echo "mcp-proxy: already installed"
    exit 0
fi
mkdir -p .tools
python3 -m venv "$dir"
"$dir/bin/pip" install --quiet --disable-pip-version-check "mcp-proxy==$VERSION"
"$dir/bin/mcp-proxy" --version 2>/dev/null || "$dir/bin/mcp-proxy" --help >/dev/null
echo "mcp-proxy: installed $VERSION in $dir"
