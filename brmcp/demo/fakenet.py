"""The demo's in-process network (``--network fake``, the default): an
in-memory :class:`~brmcp.testing.Fabric` with the asked latency (20 %
jitter), a :class:`~brmcp.testing.fakebr.FakeRelay` on it and two fake
brclients, ``bot`` and ``alice``, KX'd, each serving real TLS clientrpc on
loopback. The relay PMs of a step are the fabric's delivered PMs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .._ops.progress import StepPrinter
from ..clientrpc import BotConfig
from ..testing import Fabric, Faults
from .options import DemoOptions
from .transcript import Trace

__all__ = ["FakeNetwork"]


class FakeNetwork:
    """The relay and both fake brclients of one run (the shape
    :mod:`brmcp.demo.run` drives; ``options.latency_ms`` per PM)."""

    #: The first step's title.
    title = "Start a simulated Bison Relay network"

    def __init__(self, options: DemoOptions) -> None:
        self._options = options
        self._fabric: Fabric | None = None
        self.trace: Trace | None = None

    async def prepare(self, printer: StepPrinter) -> None:
        """Nothing to build: the fake network is pure Python."""

    async def start(self, tg: anyio.abc.TaskGroup, root: Path) -> tuple[Any, Any]:
        """Start the network in ``tg`` (files under ``root``); returns the
        ``bot`` and ``alice`` fake brclients, running."""
        latency = self._options.latency_ms / 1000.0
        faults = Faults(latency=latency, jitter=latency * 0.2) if latency > 0 else Faults()
        fabric, bot, alice = await tg.start(self._run, root, faults)
        self._fabric = fabric
        self.trace = Trace({bot.uid: "bot", alice.uid: "alice"})
        fabric.add_tap(self.trace)
        return bot, alice

    def relay_pms(self) -> int | None:
        """PMs the relay delivered so far (None before :meth:`start`)."""
        return None if self._fabric is None else self._fabric.stats.pms_delivered

    async def settle(self) -> None:
        """Nothing to wait for: the fabric counts a PM when it delivers it."""

    def describe(self, printer: StepPrinter, bot: Any, alice: Any) -> None:
        """The first step's detail lines."""
        latency = self._options.latency_ms / 1000.0
        printer.detail(f"bot   uid {bot.uid}  brclient clientrpc {bot.url}")
        printer.detail(f"alice uid {alice.uid}  brclient clientrpc {alice.url}")
        printer.detail(
            "the two are contacts; PMs cross the in-memory relay"
            + (f" with {self._options.latency_ms:.0f} ms latency" if latency else "")
        )

    def bot_config(self, user: Any, datadir: Path, name: str) -> BotConfig:
        """A bot config for the fake brclient ``user`` naming ``datadir``."""
        config: BotConfig = user.bot_config(datadir, name)
        return config

    async def _run(
        self, root: Path, faults: Faults, *, task_status: anyio.abc.TaskStatus[tuple[Fabric, Any, Any]]
    ) -> None:
        """Own the relay and both fake brclients for the whole run."""
        from ..testing.fakebr import FakeBRClient, FakeRelay

        async with Fabric(seed=7, faults=faults) as fabric, FakeRelay(fabric) as relay:
            bot = FakeBRClient(relay, "bot", root / "brclient-bot")
            alice = FakeBRClient(relay, "alice", root / "brclient-alice")
            relay.kx(bot, alice)
            async with bot, alice:
                task_status.started((fabric, bot, alice))
                await anyio.sleep_forever()
