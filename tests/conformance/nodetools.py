"""Finding the pinned Node.js MCP tools that ``.ci/node-tools`` installs.

The tools live in ``<repo>/.tools/node/node_modules`` (versions pinned in
``tests/node-tools/package.json``). The conformance suite and Inspector v2
need Node >= 22 (``@modelcontextprotocol/inspector`` 2.x declares ``node >=22.19``
and the suite imports ``fs.globSync``, new in Node 22): the npm-packaged Node 22 binary in
``node_modules/.bin/node`` is preferred, else a system ``node`` >= 22.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.kit.paths import REPO

__all__ = ["INSTALL_HINT", "NodeTools", "find_node_tools", "node_tools_for"]

MODULES = REPO / ".tools" / "node" / "node_modules"
INSTALL_HINT = "node tools not installed: run .ci/node-tools"
_MIN_MAJOR = 22


@dataclass(frozen=True)
class NodeTools:
    """Paths of the Node binary and the pinned tools' entry scripts (None
    when that tool is not installed)."""

    node: Path
    node_version: str
    conformance: Path | None
    inspector: Path | None

    def missing(self, tool: str) -> str | None:
        """A skip reason when ``tool`` ("conformance" or "inspector")
        is not installed, else None."""
        if getattr(self, tool) is None:
            return f"{INSTALL_HINT} ({tool} is missing from {MODULES})"
        return None


def _version(node: Path) -> str | None:
    try:
        done = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout.strip()
    return text if done.returncode == 0 and re.fullmatch(r"v\d+\.\d+\.\d+", text) else None


def _major(version: str) -> int:
    return int(version[1:].split(".")[0])


def _existing(path: Path) -> Path | None:
    return path if path.is_file() else None


def find_node_tools() -> NodeTools | str:
    """The installed tools, or a reason (for ``pytest.skip``) why they
    cannot run."""
    candidates = [MODULES / ".bin" / "node"]
    system = shutil.which("node")
    if system is not None:
        candidates.append(Path(system))
    chosen: tuple[Path, str] | None = None
    for candidate in candidates:
        if not candidate.exists():
            continue
        version = _version(candidate)
        if version is not None and _major(version) >= _MIN_MAJOR:
            chosen = (candidate, version)
            break
    if chosen is None:
        if not MODULES.is_dir():
            return INSTALL_HINT
        return f"no Node >= {_MIN_MAJOR} found ({INSTALL_HINT})"
    scope = MODULES / "@modelcontextprotocol"
    tools = NodeTools(
        node=chosen[0],
        node_version=chosen[1],
        conformance=_existing(scope / "conformance" / "dist" / "index.js"),
        inspector=_existing(scope / "inspector" / "clients" / "launcher" / "build" / "index.js"),
    )
    if tools.conformance is None and tools.inspector is None:
        return INSTALL_HINT
    return tools


def node_tools_for(tool: str) -> NodeTools | str:
    """The installed tools when ``tool`` ("conformance" or "inspector") can
    run, else the reason (for ``pytest.skip``) why it cannot."""
    tools = find_node_tools()
    if isinstance(tools, str):
        return tools
    reason = tools.missing(tool)
    return tools if reason is None else reason
