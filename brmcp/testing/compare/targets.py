"""The two networks the comparison probes: the fake (:class:`FakeTarget`, a
:class:`~brmcp.testing.fakebr.FakeRelay` with fake brclients in this process)
and the real one (:class:`RealTarget`, brnet). Both offer users ``alice`` and
``bob`` (KX'd) and the same controls: a clientrpc client per user, a brclient
restart that keeps the user's root, and taking a user off the relay and back.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import anyio

from ...clientrpc import Client

__all__ = ["FakeTarget", "RealTarget", "Target", "fake_target", "real_target"]

#: clientrpc client options for probes: no own pings, quick reconnects.
CLIENT_OPTIONS: dict[str, Any] = {"ping_interval": None, "backoff_initial": 0.1, "backoff_max": 1.0}


class Target(Protocol):
    name: str
    #: seconds TipUser blocks after a brclient starts (brclient's tipuser.restartdelay).
    tip_restart_delay: float

    def uid(self, nick: str) -> str: ...

    def client(self, nick: str) -> Client: ...

    async def restart(self, nick: str) -> None: ...

    async def offline(self, nick: str) -> None: ...

    async def online(self, nick: str) -> None: ...


class RealTarget:
    """brnet (``users``: alice, bob; ``nowallet``: nicks without a wallet)."""

    name = "real"

    def __init__(self, net: Any, tip_restart_delay: float) -> None:
        self.net = net
        self.tip_restart_delay = tip_restart_delay

    def uid(self, nick: str) -> str:
        return str(self.net.user(nick).uid)

    def client(self, nick: str) -> Client:
        return self.net.user(nick).client(**CLIENT_OPTIONS)  # type: ignore[no-any-return]

    async def restart(self, nick: str) -> None:
        await anyio.to_thread.run_sync(self.net.restart_user, nick)

    async def offline(self, nick: str) -> None:
        await anyio.to_thread.run_sync(self.net.offline, nick)

    async def online(self, nick: str) -> None:
        await anyio.to_thread.run_sync(self.net.online, nick)
        await anyio.sleep(1.0)  # brnet's 0.5 s reconnect delay plus the session set-up


class FakeTarget:
    """The fake relay and fake brclients in this process. A restart replaces
    the user's fake brclient by a new one on the same root and uid, as a new
    ``brmcp-fakebr`` process does."""

    name = "fake"

    def __init__(self, relay: Any, root: Path, options: dict[str, Any], tip_restart_delay: float) -> None:
        self.relay = relay
        self.root = root
        self.options = options
        self.tip_restart_delay = tip_restart_delay
        self.users: dict[str, Any] = {}
        self._stack = contextlib.AsyncExitStack()
        self._scopes: dict[str, contextlib.AsyncExitStack] = {}

    async def _start(self, nick: str, uid: str | None = None) -> None:
        from ..fakebr import FakeBRClient

        if uid is not None:
            # A new process: the relay forgets the old object, keeps the user.
            self.relay._clients.pop(uid, None)
            self.relay.nicks.pop(uid, None)
        user = FakeBRClient(self.relay, nick, self.root / nick, uid=uid, **self.options.get(nick, {}))
        scope = contextlib.AsyncExitStack()
        await scope.enter_async_context(user)
        self.users[nick] = user
        self._scopes[nick] = scope

    def uid(self, nick: str) -> str:
        return str(self.users[nick].uid)

    def client(self, nick: str) -> Client:
        return self.users[nick].client(**CLIENT_OPTIONS)  # type: ignore[no-any-return]

    async def restart(self, nick: str) -> None:
        uid = self.uid(nick)
        contacts = self.relay.contacts(uid)
        await self._scopes.pop(nick).aclose()
        await self._start(nick, uid)
        for other in contacts:
            self.relay.kx(uid, other)

    async def offline(self, nick: str) -> None:
        self.relay.set_offline(self.uid(nick))

    async def online(self, nick: str) -> None:
        self.relay.set_online(self.uid(nick))

    async def aclose(self) -> None:
        for scope in list(self._scopes.values()):
            await scope.aclose()
        self._scopes.clear()


@contextlib.asynccontextmanager
async def fake_target(
    root: Path, *, nowallet: tuple[str, ...] = (), tip_restart_delay: float = 2.0, realistic: bool = True
) -> AsyncIterator[FakeTarget]:
    """A fake network with alice and bob. ``realistic``: turn on the fake's
    options that cost speed (PM pacing, TipUser blocking after start) as a
    real brclient has them; off, the fake runs as the fast unit tests use it."""
    from ..fakebr import FakeRelay

    options: dict[str, Any] = {nick: {} for nick in ("alice", "bob")}
    for nick in nowallet:
        options[nick]["wallet"] = False  # brclient's [payment] wallettype = disabled
    if realistic:
        for nick in options:
            options[nick].update(pm_pacing=0.1, tip_restart_delay=tip_restart_delay)
    async with FakeRelay() as relay:
        target = FakeTarget(relay, root, options, tip_restart_delay if realistic else 0.0)
        try:
            await target._start("alice")
            await target._start("bob")
            relay.kx(target.uid("alice"), target.uid("bob"))
            yield target
        finally:
            await target.aclose()


@contextlib.asynccontextmanager
async def real_target(
    root: Path, *, nowallet: tuple[str, ...] = (), tip_restart_delay: float = 2.0, binary: Any = None
) -> AsyncIterator[RealTarget]:
    """brnet with alice and bob (built if needed)."""
    from ..brnet import BrNet

    net = BrNet(
        root,
        users=("alice", "bob"),
        nowallet=nowallet,
        tip_restart_delay=tip_restart_delay,
        reconnect_delay=0.5,
        binary=binary,
    )
    await anyio.to_thread.run_sync(net.start)
    try:
        yield RealTarget(net, tip_restart_delay)
    finally:
        await anyio.to_thread.run_sync(net.stop)
