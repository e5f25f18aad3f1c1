"""Shared pieces for the harness tests: serve a :class:`Harness` on the
in-memory fabric and talk to it with the official SDK client, plus helpers
to read results and the ledger database directly.

Imported by tests/test_harness_*.py and tests/test_ledger_*.py (pytest puts
tests/ on sys.path).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp import ClientSession

from brmcp import Router, wire
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid
from tests.kit import ALICE, BOB, BOT

ADMIN = uid(10)
MALLORY = uid(14)
PEERS = (ALICE, BOB, ADMIN, MALLORY)

DB_NAME = "brmcp.sqlite3"


@dataclass
class Served:
    """A started harness on a fabric; :meth:`client` opens SDK sessions."""

    harness: Harness
    fabric: Fabric
    router: Router
    stack: AsyncExitStack
    clients: dict[str, Router] = field(default_factory=dict)
    #: Envelope parts the bot has received so far (every PM is passed to
    #: its router; a batch PM counts each of its parts, WIRE.md §Batches)
    pms: int = 0
    _waiters: list[tuple[int, anyio.Event]] = field(default_factory=list)

    def tap(self, peer: str, text: str) -> None:
        """The bot's fabric endpoint: hand to the router, then count."""
        self.router.handle_pm(peer, text)
        self.pms += len(wire.split_batch(text) or [text])
        for count, event in self._waiters:
            if self.pms >= count:
                event.set()

    async def wait_pms(self, count: int) -> None:
        """Wait until the bot has received ``count`` parts in total."""
        if self.pms >= count:
            return
        event = anyio.Event()
        self._waiters.append((count, event))
        await event.wait()

    @asynccontextmanager
    async def client(self, peer: str, *, read_timeout: float = 10.0) -> AsyncIterator[ClientSession]:
        """An initialized handshake-era ClientSession from ``peer`` to the bot."""
        conn = self.clients[peer].dial(BOT)
        streams = (conn.read_stream, conn.write_stream)
        async with ClientSession(*streams, read_timeout_seconds=read_timeout) as s:
            await s.initialize()
            yield s


@asynccontextmanager
async def served(harness: Harness) -> AsyncIterator[Served]:
    """Enter ``harness``, start it on a fresh fabric as :data:`BOT`, yield."""
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        await stack.enter_async_context(harness)
        router = await harness.start(fabric.sender(BOT))
        srv = Served(harness, fabric, router, stack)
        fabric.attach(BOT, srv.tap)
        # Client routers own task groups: open them all here, outside any session.
        for peer in PEERS:
            srv.clients[peer] = await stack.enter_async_context(fabric.router(peer))
        yield srv


async def call(
    session: ClientSession, name: str, args: dict[str, Any] | None = None, key: Any = None
) -> types.CallToolResult:
    """tools/call with an optional ``brmcp/callKey`` (any JSON value, to
    exercise invalid keys too)."""
    meta: Any = None if key is None else {"brmcp/callKey": key}
    return await session.call_tool(name, args or {}, meta=meta)


def text_of(result: types.CallToolResult) -> str:
    """The single text content of a result."""
    assert len(result.content) == 1, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def ok_text(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    return text_of(result)


def err_text(result: types.CallToolResult) -> str:
    assert result.is_error, result
    return text_of(result)


def payment_required_json(tool: str, price: int, balance: int) -> str:
    """The exact refusal text of WIRE.md §Payments (Go struct key order)."""
    return (
        f'{{"error":"payment_required","tool":"{tool}","priceAtoms":{price},'
        f'"balanceAtoms":{balance},"shortfallAtoms":{price - balance},"acceptedRails":["tip"]}}'
    )


class Counter:
    """Counts handler executions per tool, with the CallContexts seen."""

    def __init__(self) -> None:
        self.contexts: list[CallContext] = []

    def __call__(self, ctx: CallContext) -> int:
        self.contexts.append(ctx)
        return len(self.contexts)

    @property
    def n(self) -> int:
        return len(self.contexts)


def standard_harness(data_dir: Path | None, **config: Any) -> tuple[Harness, Counter]:
    """A harness with the reference tests' tools:

    * ``paid`` (500 atoms) returns ``{"n": <executions so far>}``;
    * ``failing`` (500 atoms) always raises ``handler exploded``;
    * ``free`` (0) echoes ``{"text": ...}``.
    """
    config.setdefault("allowed_peers", {ALICE, BOB})
    harness = Harness(HarnessConfig(data_dir=data_dir, **config))
    runs = Counter()

    @harness.tool(price_atoms=500, description="A paid tool")
    async def paid(ctx: CallContext) -> dict[str, Any]:
        return {"n": runs(ctx)}

    @harness.tool(price_atoms=500, description="A paid tool that always fails")
    async def failing(ctx: CallContext) -> dict[str, Any]:
        runs(ctx)
        raise RuntimeError("handler exploded")

    @harness.tool(description="A free echo")
    async def free(ctx: CallContext, text: str = "") -> dict[str, Any]:
        runs(ctx)
        return {"text": text}

    return harness, runs


def names(directory: Path) -> list[str]:
    """Sorted file names in ``directory``."""
    return sorted(p.name for p in directory.iterdir())


def db_path(data_dir: Path) -> Path:
    return data_dir / DB_NAME


def query(data_dir: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run a read query on the ledger database (a separate connection)."""
    conn = sqlite3.connect(db_path(data_dir))
    try:
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]
    finally:
        conn.close()


def execute(data_dir: Path, script: Callable[[sqlite3.Connection], None]) -> None:
    """Write to the ledger database in one transaction (to fake a crash)."""
    conn = sqlite3.connect(db_path(data_dir), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        script(conn)
        conn.execute("COMMIT")
    finally:
        conn.close()


def loads(text: str) -> Any:
    return json.loads(text)
