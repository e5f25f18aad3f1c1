"""Shared helpers for the clientrpc / fakebr tests: a relay with fake brclients
on loopback, client settings that keep the suite fast, and a poll-until helper."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from brmcp.clientrpc.protojson import frame
from brmcp.testing.fakebr import FakeBRClient, FakeRelay
from tests.kit import until as until

#: Client options for tests: quick reconnects, no keepalive unless a test wants it.
FAST: dict[str, Any] = {"backoff_initial": 0.05, "backoff_max": 0.2, "ping_interval": None}


@contextlib.asynccontextmanager
async def fake_network(
    tmp_path: Path, *nicks: str, contacts: bool = True, **fake_kwargs: Any
) -> AsyncIterator[tuple[FakeRelay, list[FakeBRClient]]]:
    """A running relay with one running fake brclient per nick (mutual contacts)."""
    async with FakeRelay() as relay, contextlib.AsyncExitStack() as stack:
        fakes = [FakeBRClient(relay, nick, tmp_path / nick, **fake_kwargs) for nick in nicks]
        if contacts and len(fakes) > 1:
            relay.kx_all(*fakes)
        for fake in fakes:
            await stack.enter_async_context(fake)
        yield relay, fakes


def client_ssl(fake: FakeBRClient) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(fake.certs.server_cert))
    ctx.load_cert_chain(fake.certs.client_cert, fake.certs.client_key)
    return ctx


@contextlib.asynccontextmanager
async def raw_ws(fake: FakeBRClient, **kwargs: Any) -> AsyncIterator[ClientConnection]:
    """A bare websockets connection to the fake (no client logic), for wire tests."""
    kwargs.setdefault("ping_interval", None)
    kwargs.setdefault("compression", None)
    kwargs.setdefault("proxy", None)
    kwargs.setdefault("max_size", None)
    async with connect(fake.url, ssl=client_ssl(fake), **kwargs) as ws:
        yield ws


async def request(ws: ClientConnection, rid: Any, method: str, params: Any = None) -> None:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "params": {} if params is None else params}
    message["method"] = method
    await ws.send(frame(message))


async def recv_json(ws: ClientConnection) -> Any:
    raw = await ws.recv()
    assert isinstance(raw, bytes), "the fake sends binary frames"
    assert raw.endswith(b"\n")
    return json.loads(raw)
