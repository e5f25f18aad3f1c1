"""Step-by-step console output for long-running commands.

On a terminal a running step shows a spinner with the elapsed seconds; when
the output is a pipe or a file, a step prints one plain line when it ends,
plus a "still waiting" line every few seconds while a long step runs, so
logs stay readable.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import TextIO

import anyio

__all__ = ["StepPrinter"]

_FRAMES = "|/-\\"


class StepPrinter:
    """Prints ``[n/total] title ... ok (1.2 s)`` lines and detail lines.

    ``tty`` None means "ask the stream" (``isatty``).
    """

    def __init__(self, out: TextIO, total: int, *, tty: bool | None = None) -> None:
        self.out = out
        self.total = total
        self.index = 0
        self.tty = out.isatty() if tty is None else tty

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def detail(self, text: str) -> None:
        """An indented line under the current step."""
        self.line(f"      {text}")

    @contextlib.asynccontextmanager
    async def step(self, title: str) -> AsyncIterator[None]:
        """Run the body as the next step. On success prints ``ok`` and the
        duration; on failure prints ``FAILED`` and re-raises."""
        self.index += 1
        label = f"[{self.index}/{self.total}] {title}"
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            if self.tty:
                tg.start_soon(self._spin, label, started)
            else:
                tg.start_soon(self._heartbeat, label, started)
            try:
                yield
            except BaseException:
                tg.cancel_scope.cancel()
                self._finish(label, started, "FAILED")
                raise
            tg.cancel_scope.cancel()
        self._finish(label, started, "ok")

    def _finish(self, label: str, started: float, verdict: str) -> None:
        elapsed = time.monotonic() - started
        if self.tty:
            self.out.write("\r\x1b[K")
        self.line(f"{label} ... {verdict} ({elapsed:.1f} s)")

    async def _heartbeat(self, label: str, started: float) -> None:
        await anyio.sleep(2.0)
        while True:
            self.line(f"{label} ... still waiting ({time.monotonic() - started:.0f} s)")
            await anyio.sleep(5.0)

    async def _spin(self, label: str, started: float) -> None:
        frame = 0
        while True:
            elapsed = time.monotonic() - started
            self.out.write(f"\r\x1b[K{label} {_FRAMES[frame % len(_FRAMES)]} {elapsed:.1f} s")
            self.out.flush()
            frame += 1
            await anyio.sleep(0.1)
