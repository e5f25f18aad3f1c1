"""The admin log (docs/directory.md §Admin; karamble/brmcp,
``directory/admin.go``): every mutating admin call that succeeded is
appended to ``adminlog.json``, one JSON object per line: ``{"ts", "actor",
"action", "args"}`` (``args`` is the call's input as Go writes its input
struct, omitted when empty). Apart from the admin tools so the service can
hold it without importing them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from brmcp._ops import gojson

log = logging.getLogger("brmcp.directory")

__all__ = ["ADMIN_LOG_FILENAME", "AdminLog"]

ADMIN_LOG_FILENAME = "adminlog.json"


class AdminLog:
    """The append-only audit trail at ``path`` (created 0600 on first use).
    Lines are appended whole with one ``write`` on an ``O_APPEND`` file, off
    the event loop; nothing is ever rewritten."""

    def __init__(self, path: str | os.PathLike[str], clock: Callable[[], float]) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = anyio.Lock()

    async def append(self, actor: str, action: str, args: dict[str, Any] | None) -> None:
        """Append ``{"ts", "actor", "action", "args"}`` (Go's field order;
        ``args`` omitted when empty). A file that cannot be written is
        logged as an error and the call it records stands (as in Go)."""
        entry: dict[str, Any] = {"ts": int(self._clock()), "actor": actor, "action": action}
        if args:
            entry["args"] = args
        line = (gojson.dumps(entry) + "\n").encode()

        def write() -> None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)

        async with self._lock:
            try:
                await anyio.to_thread.run_sync(write)
            except OSError as exc:
                log.error("admin log %s: %s not recorded: %s", self.path, action, exc.strerror or exc)
