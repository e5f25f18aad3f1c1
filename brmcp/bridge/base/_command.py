"""The ``brmcp-bridge`` command line that hints and pages print: with
``--datadir`` when the bridge's data directory is not the default, so the
printed commands can be pasted as they are."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

__all__ = ["PROG", "cli_command", "default_datadir"]

PROG = "brmcp-bridge"


def default_datadir() -> Path:
    """``~/.brmcp-bridge`` (Linux/BSD), ``~/Library/Application Support/Brmcp-bridge``
    (macOS), ``%LOCALAPPDATA%\\Brmcp-bridge`` (Windows)."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Brmcp-bridge"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return (Path(local) if local else home / "AppData" / "Local") / "Brmcp-bridge"
    return home / ".brmcp-bridge"


def _normal(path: Path) -> str:
    return os.path.normcase(os.path.abspath(path.expanduser()))


def cli_command(data_dir: str | os.PathLike[str]) -> str:
    """``brmcp-bridge`` for the default data directory, else
    ``brmcp-bridge --datadir <data_dir>``: the directory made absolute (a
    hint is pasted from anywhere) and quoted for a POSIX shell when needed."""
    path = Path(data_dir).expanduser()
    if _normal(path) == _normal(default_datadir()):
        return PROG
    return f"{PROG} --datadir {shlex.quote(os.path.abspath(path))}"
