"""The daemon's runtime file (BRIDGE.md "Running the daemon", "Admin
surface"): while ``brmcp-bridge`` runs, ``<datadir>/brmcp-bridge.runtime.json``
tells the CLI where its admin surface is and whether it reloads on SIGHUP.

The record is ``{"pid", "started", "listen", "url", "sighup"}`` (JSON, mode
0600, written atomically): ``pid`` the daemon's process id, ``started`` its
start time in clock ticks since boot where the system tells it (Linux
``/proc/<pid>/stat`` field 22), else null; ``listen`` the endpoint's
``host:port``, ``url`` its ``http://host:port``, ``sighup`` whether the
daemon reloads its settings on SIGHUP. A daemon killed with SIGKILL leaves
its record behind: :func:`runtime_stale_reason` tells such a record.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from brmcp.bridge.base import read_text, write_atomic

__all__ = ["RUNTIME_FILE", "read_runtime", "remove_runtime", "runtime_stale_reason", "write_runtime"]

#: Written while the daemon runs: ``{"pid", "started", "listen", "url", "sighup"}`` (JSON,
#: mode 0600); see :func:`read_runtime`.
RUNTIME_FILE = "brmcp-bridge.runtime.json"


def read_runtime(datadir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The daemon's runtime record (``pid``; ``started``, the process start
    time in clock ticks since boot where the system tells it, else null;
    ``listen``; ``url``; ``sighup``), or None when there is no (readable)
    file. A daemon killed with SIGKILL leaves its record behind: check it
    with :func:`runtime_stale_reason` before trusting it."""
    path = Path(datadir) / RUNTIME_FILE
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError):
        return None
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def write_runtime(datadir: str | os.PathLike[str], *, listen: str, url: str, sighup: bool) -> None:
    """Write this process's runtime record to ``<datadir>/`` :data:`RUNTIME_FILE`
    (atomically, mode 0600): ``listen`` is the endpoint's ``host:port``,
    ``url`` its ``http://host:port``, ``sighup`` whether SIGHUP reloads the
    settings. Raises OSError."""
    pid = os.getpid()
    record = {
        "pid": pid,
        "started": process_started(pid),
        "listen": listen,
        "url": url,
        "sighup": sighup,
    }
    write_atomic(Path(datadir) / RUNTIME_FILE, json.dumps(record) + "\n")


def remove_runtime(datadir: str | os.PathLike[str]) -> None:
    """Remove the runtime record if this process wrote it (a record of
    another process, e.g. a daemon started since, is left alone); errors
    are ignored."""
    record = read_runtime(datadir)
    if record is not None and record.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            (Path(datadir) / RUNTIME_FILE).unlink()


def runtime_stale_reason(record: Mapping[str, Any]) -> str | None:
    """None when the process a runtime record names still runs (and, where
    the system reports process start times, is the same process that wrote
    the record); otherwise why the record is stale, e.g. ``process 123 is
    gone`` or ``pid 123 now belongs to another process``."""
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return "it names no process"
    if not _pid_alive(pid):
        return f"process {pid} is gone"
    started = record.get("started")
    if isinstance(started, int) and not isinstance(started, bool):
        now = process_started(pid)
        if now is not None and now != started:
            return f"pid {pid} now belongs to another process"
    return None


def process_started(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux
    ``/proc/<pid>/stat`` field 22), or None where that is not available."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold anything.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True
