"""The demo's real network (``--network real``): brnet, a real bisonrelay
relay and real brclients ``bot`` and ``alice`` on loopback (a Go program,
built on first use, outside any step's timeout), with ``latency_ms`` added
one way to every message a client sends to the relay. A step's relay PMs are
counted by listening on both clients' PM streams."""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from .._ops.progress import StepPrinter
from ..clientrpc import BotConfig
from .options import NO_GO, DemoError, DemoOptions
from .transcript import Trace

__all__ = ["RealNetwork"]


class RealNetwork:
    """The brnet of one run (the shape :mod:`brmcp.demo.run` drives).
    ``client_options`` go to the clientrpc clients that watch the PMs."""

    #: The first step's title.
    title = "Start a real Bison Relay network (brnet)"

    def __init__(self, options: DemoOptions, client_options: dict[str, Any]) -> None:
        self._options = options
        self._client_options = client_options
        self._observer: _PMObserver | None = None
        self._info: tuple[str, Path] | None = None
        self.trace: Trace | None = None

    async def prepare(self, printer: StepPrinter) -> None:
        """Build brnet (Go) before the first step, outside the step timeout:
        the first build downloads and compiles bisonrelay (minutes); its
        progress goes to stderr, so the transcript on stdout stays clean.
        Raises :class:`DemoError` without Go or when the build fails."""
        from ..testing.brnet import BrNetBuildError, BrNetUnavailable, GoNotFound, brnet_binary

        try:
            exe = await anyio.to_thread.run_sync(partial(brnet_binary, progress=_to_stderr))
        except GoNotFound:
            raise DemoError(NO_GO) from None
        except BrNetUnavailable as exc:
            raise DemoError(f"--network real cannot build brnet: {exc}") from None
        except BrNetBuildError as exc:
            raise DemoError(f"{exc.summary} (Go's output is above)") from None
        printer.line(f"brnet (the real Bison Relay network): {exe}")

    async def start(self, tg: anyio.abc.TaskGroup, root: Path) -> tuple[Any, Any]:
        """Start brnet and the PM observer in ``tg`` (files under ``root``);
        returns the ``bot`` and ``alice`` users."""
        net = await tg.start(self._run, root)
        bot, alice = net.user("bot"), net.user("alice")
        self._info = (str(net.info["relay"]), net.root)
        self.trace = Trace({bot.uid: "bot", alice.uid: "alice"})
        self._observer = _PMObserver(self.trace, self._client_options)
        await tg.start(self._observer.run, bot, alice)
        return bot, alice

    def relay_pms(self) -> int | None:
        """PMs seen between the two clients so far (None before :meth:`start`)."""
        return None if self._observer is None else self._observer.count

    async def settle(self) -> None:
        """Wait for PMs still in flight (see :meth:`_PMObserver.settle`)."""
        if self._observer is not None:
            await self._observer.settle()

    def describe(self, printer: StepPrinter, bot: Any, alice: Any) -> None:
        """The first step's detail lines."""
        assert self._info is not None
        relay, root = self._info
        latency = self._options.latency_ms / 1000.0
        printer.detail(f"relay {relay} (bisonrelay server), root {root}")
        printer.detail(f"bot   uid {bot.uid}  brclient clientrpc {bot.url}")
        printer.detail(f"alice uid {alice.uid}  brclient clientrpc {alice.url}")
        printer.detail(
            "real bisonrelay clients, KX'd; tips through a simulated wallet"
            + (f"; {self._options.latency_ms:.0f} ms added one way" if latency else "")
        )

    def bot_config(self, user: Any, datadir: Path, name: str) -> BotConfig:
        """A bot config for the brnet ``user`` naming ``datadir``."""
        config: BotConfig = user.bot_config_for(datadir, name)
        return config

    async def _run(self, root: Path, *, task_status: anyio.abc.TaskStatus[Any]) -> None:
        """Own a brnet (users bot and alice) for the whole run."""
        from ..testing.brnet import BrNet, BrNetError

        net = BrNet(
            root / "brnet",
            users=("bot", "alice"),
            latency_ms=self._options.latency_ms,
            tip_restart_delay=1.0,
            reconnect_delay=0.5,
        )
        try:
            await anyio.to_thread.run_sync(net.start)
        except BrNetError as exc:
            raise DemoError(f"brnet did not start: {exc}") from None
        try:
            task_status.started(net)
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(net.stop)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _PMObserver:
    """Counts and traces the PMs between the two real brclients by listening on
    each one's PM stream (without acking: the bot and the bridge ack their
    own). A PM received by the bot came from alice and the other way round."""

    def __init__(self, trace: Trace, client_options: dict[str, Any]) -> None:
        self.trace = trace
        self.client_options = client_options
        self.count = 0
        self._last = time.monotonic()

    async def settle(self, quiet: float = 0.3, limit: float = 3.0) -> None:
        """Wait until no PM arrived for ``quiet`` seconds (at most ``limit``),
        so a step's count includes PMs still in flight when it returned."""
        deadline = time.monotonic() + limit
        while True:
            now = time.monotonic()
            if now >= deadline or now - self._last >= quiet:
                return
            await anyio.sleep(0.05)

    async def run(self, bot: Any, alice: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with (
            bot.client(**self.client_options) as at_bot,
            alice.client(**self.client_options) as at_alice,
            anyio.create_task_group() as tg,
        ):
            await at_bot.wait_connected()
            await at_alice.wait_connected()
            subs = [(at_bot.pm_stream(), alice.uid, bot.uid), (at_alice.pm_stream(), bot.uid, alice.uid)]
            for sub, _, _ in subs:
                await sub.wait_open()
            for sub, sender, receiver in subs:
                tg.start_soon(self._drain, sub, sender, receiver)
            task_status.started()

    async def _drain(self, sub: Any, sender: str, receiver: str) -> None:
        async for pm in sub:
            if pm.uid != sender:
                continue
            self.count += 1
            self._last = time.monotonic()
            self.trace(sender, receiver, pm.message)
