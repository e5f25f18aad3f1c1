"""Shared pieces for the brmcp-serve and brmcp-bridge end-to-end tests: a fake
relay with a bot and callers, the serve app on the bot's fake brclient, and
an MCP caller that speaks over its own fake brclient (brmcp.Router fed from
its PM stream, sender = its clientrpc client)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from mcp import ClientSession

from brmcp import Router
from brmcp.clientrpc import Client
from brmcp.serve import ServeApp, init_datadir
from brmcp.testing.fakebr import FakeBRClient, FakeRelay
from tests.kit.clientrpc import FAST, fake_network
from tests.kit.clientrpc import until as until  # re-exported for the serve and bridge tests


@dataclass
class Caller:
    """An MCP client on a fake brclient: dial the bot, open SDK sessions."""

    fake: FakeBRClient
    client: Client
    router: Router

    @contextlib.asynccontextmanager
    async def session(self, bot_uid: str, read_timeout: float = 20.0) -> AsyncIterator[ClientSession]:
        conn = self.router.dial(bot_uid)
        try:
            async with ClientSession(
                conn.read_stream, conn.write_stream, read_timeout_seconds=read_timeout
            ) as s:
                yield s
        finally:
            conn.close()


@contextlib.asynccontextmanager
async def caller_on(fake: FakeBRClient) -> AsyncIterator[Caller]:
    """A clientrpc client to ``fake`` whose PMs feed a client-role Router (acked after)."""
    async with fake.client(**FAST) as client, Router(client) as router, anyio.create_task_group() as tg:
        pms = client.pm_stream()

        async def feed() -> None:
            async for pm in pms:
                router.handle_pm(pm.uid, pm.message)
                with contextlib.suppress(Exception):
                    await client.ack_received_pm(pm.sequence_id)

        tg.start_soon(feed)
        await client.wait_connected()
        await pms.wait_open()
        yield Caller(fake, client, router)
        tg.cancel_scope.cancel()


def prepare_serve_dir(datadir: Path, bot: FakeBRClient, allowed: list[str] | None) -> None:
    """A brmcp-serve data directory pointing at ``bot``'s fake brclient."""
    created = init_datadir(datadir, bot_config=bot.bot_config(datadir), allowed_uids=allowed)
    assert len(created) == 2


@dataclass
class ServeEnv:
    relay: FakeRelay
    bot: FakeBRClient
    alice: FakeBRClient
    others: list[FakeBRClient]
    app: ServeApp
    datadir: Path


@contextlib.asynccontextmanager
async def serve_network(
    tmp_path: Path, *, allowed: list[str] | None = None, extra: tuple[str, ...] = (), **app_kwargs: Any
) -> AsyncIterator[ServeEnv]:
    """Relay + fake brclients ``bot``, ``alice`` (+ ``extra``), all contacts,
    and the serve app running on the bot. ``allowed`` defaults to alice."""
    async with fake_network(tmp_path / "br", "bot", "alice", *extra) as (relay, fakes):
        bot, alice, *others = fakes
        datadir = tmp_path / "serve"
        prepare_serve_dir(datadir, bot, [alice.uid] if allowed is None else allowed)
        app = ServeApp.from_datadir(datadir, client_options=FAST, **app_kwargs)
        async with anyio.create_task_group() as tg:
            await tg.start(app.run)
            await app.client.wait_connected()
            yield ServeEnv(relay, bot, alice, others, app, datadir)
            tg.cancel_scope.cancel()
