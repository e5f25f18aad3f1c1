"""A directory and its providers on the in-memory fabric, for the directory
tests (brmcp/directory/_service.py).

* :class:`Provider`: a harness bot (a paid ``fortune`` tool and a free
  ``echo``) whose router also dials the directory as the provider's client;
* :class:`TipPayer`: the directory's payer; a payment is a tip credited to
  the payee's harness (once, with a fresh sequence id), optionally failing
  definitively or in doubt;
* :func:`directory_stack`: a started :class:`Directory` plus providers,
  with helpers to call the directory as any uid.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp import ClientSession

from brmcp import ManualClock, Router
from brmcp.directory import Directory, DirectoryConfig, Policy, Timeouts
from brmcp.protocol.receipts import ReceiptSigner
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid

DIRECTORY = uid(50)
PROVIDER = uid(51)
PROVIDER2 = uid(52)
ADMIN = uid(53)
CALLER = uid(54)
PEER_DIR = uid(55)

FEE = 1_000
PRICE = 500
BUDGET = 2_000
START = 1_800_000_000.0
DAY = 86_400

#: Fast bounds so a provider that never answers fails the test quickly.
FAST = Timeouts(dial=5.0, crawl=5.0, call=5.0, pay=5.0, credit_polls=2, credit_poll_delay=3.0)


class PayError(Exception):
    """A definitive rail failure (no money left)."""


class InDoubtError(Exception):
    """A payment that may still land."""

    may_land = True


@dataclass
class TipPayer:
    """Pays by crediting the payee's harness as a tip from the directory.
    ``fail`` makes the next payments fail definitively (``"fail"``) or in
    doubt (``"doubt"``: the tip lands, the confirmation does not), or
    land and never confirm (``"hang"``)."""

    harnesses: dict[str, Harness] = field(default_factory=dict)
    #: Other payees: ``pay(payee, atoms)`` (a hostile bot's ``tip_from``).
    hooks: dict[str, Callable[[str, int], Awaitable[None]]] = field(default_factory=dict)
    sent: list[tuple[str, int]] = field(default_factory=list)
    fail: list[str] = field(default_factory=list)
    seq: int = 0

    async def pay(self, payee_uid: str, atoms: int) -> None:
        mode = self.fail.pop(0) if self.fail else ""
        if mode == "fail":
            raise PayError("tip failed: no route")
        self.seq += 1
        self.sent.append((payee_uid, atoms))
        target = self.harnesses.get(payee_uid)
        if target is not None:
            await target.credit_tip(DIRECTORY, atoms * 1000, self.seq)
        elif payee_uid in self.hooks:
            await self.hooks[payee_uid](payee_uid, atoms)
        if mode == "doubt":
            raise InDoubtError("tip not confirmed yet")
        if mode == "hang":
            await anyio.sleep_forever()

    @property
    def total(self) -> int:
        return sum(atoms for _, atoms in self.sent)


def provider_harness(
    data_dir: Path, *, price: int = PRICE, receipt_signer: ReceiptSigner | None = None
) -> tuple[Harness, list[str]]:
    """A provider: ``fortune`` (``price`` atoms) logs each run in the
    returned list; ``echo`` is free. With ``receipt_signer`` its paid
    results carry signed receipts (WIRE.md §Signed receipts)."""
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir, allow=lambda _peer: True, name="provider", receipt_signer=receipt_signer
        )
    )
    runs: list[str] = []

    @harness.tool(price_atoms=price, description="A fortune cookie")
    async def fortune(ctx: CallContext, topic: str = "") -> dict[str, Any]:
        runs.append(ctx.call_key or "")
        return {"fortune": f"good things about {topic or 'everything'}"}

    @harness.tool(description="Echo, free")
    async def echo(ctx: CallContext, text: str = "") -> dict[str, Any]:
        return {"text": text}

    return harness, runs


@dataclass
class Stack:
    fabric: Fabric
    directory: Directory
    payer: TipPayer
    clock: ManualClock
    stack: AsyncExitStack
    data_dir: Path
    routers: dict[str, Router] = field(default_factory=dict)
    sessions: dict[str, ClientSession] = field(default_factory=dict)

    def router_of(self, who: str) -> Router:
        return self.routers[who]

    async def session(self, who: str) -> ClientSession:
        """``who``'s session to the directory (one per uid, opened on first
        use: a router admits at most 8 sessions per peer)."""
        if who not in self.sessions:
            conn = self.routers[who].dial(DIRECTORY)
            session = await self.stack.enter_async_context(
                ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=20)
            )
            await session.initialize()
            self.sessions[who] = session
        return self.sessions[who]

    async def call(self, who: str, tool: str, args: dict[str, Any] | None = None) -> types.CallToolResult:
        return await (await self.session(who)).call_tool(tool, args or {})

    async def ok(self, who: str, tool: str, args: dict[str, Any] | None = None) -> Any:
        """The structured answer of a successful call (its text is the same JSON)."""
        result = await self.call(who, tool, args)
        assert not result.is_error, result
        block = result.content[0]
        assert isinstance(block, types.TextContent)
        assert json.loads(block.text) == result.structured_content
        return result.structured_content

    async def error(self, who: str, tool: str, args: dict[str, Any] | None = None) -> str:
        result = await self.call(who, tool, args)
        assert result.is_error, result
        block = result.content[0]
        assert isinstance(block, types.TextContent)
        return block.text

    async def add_provider(self, who: str, harness: Harness) -> None:
        """Serve ``harness`` at ``who`` on the fabric (its router also dials)."""
        await self.stack.enter_async_context(harness)
        router = await harness.start(self.fabric.sender(who))
        self.fabric.attach(who, router.handle_pm)
        self.routers[who] = router
        self.payer.harnesses[who] = harness

    async def add_client(self, who: str) -> None:
        self.routers[who] = await self.stack.enter_async_context(self.fabric.router(who))

    async def add_peer_directory(self, timeouts: Timeouts) -> Directory:
        """A second directory ``peerdir`` served at :data:`PEER_DIR` (data in
        ``data_dir/peer``, its own payer), paid by this stack's payer like
        any payee; its listings are for the caller to write."""
        peer = Directory(
            DirectoryConfig(
                self.data_dir / "peer",
                policy(name="peerdir"),
                TipPayer(),
                self_uid=PEER_DIR,
                clock=self.clock,
                timeouts=timeouts,
                sweep_interval=0,
            )
        )
        await self.stack.enter_async_context(peer)
        router = await peer.start(self.fabric.sender(PEER_DIR))
        self.fabric.attach(PEER_DIR, router.handle_pm)
        self.payer.harnesses[PEER_DIR] = peer.harness
        return peer


def register_args(tool: str = "fortune", max_atoms: int = BUDGET, **extra: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "description": "fortunes on demand",
        "tags": ["Fun", "fortune"],
        "test": {"tool": tool, "args": {"topic": "tests"}, "maxAtoms": max_atoms},
    }
    args.update(extra)
    return args


def policy(**values: Any) -> Policy:
    values.setdefault("admin_uids", (ADMIN,))
    values.setdefault("listing_fee_atoms", FEE)
    values.setdefault("snapshot_price_atoms", 300)
    values.setdefault("calls_per_minute", 10_000)
    return Policy(**values)


@asynccontextmanager
async def directory_stack(
    data_dir: Path,
    *,
    pol: Policy | None = None,
    clock: ManualClock | None = None,
    payer: TipPayer | None = None,
    fabric: Fabric | None = None,
    **config: Any,
) -> AsyncIterator[Stack]:
    """A started directory at :data:`DIRECTORY` (data in ``data_dir/dir``)
    with clients :data:`ADMIN` and :data:`CALLER`; providers are added with
    :meth:`Stack.add_provider`."""
    clock = clock or ManualClock(START, auto=True)
    payer = payer or TipPayer()
    config.setdefault("timeouts", FAST)
    config.setdefault("sweep_interval", 0)
    async with AsyncExitStack() as stack:
        fab = fabric if fabric is not None else await stack.enter_async_context(Fabric())
        directory = Directory(
            DirectoryConfig(
                data_dir / "dir", pol or policy(), payer, self_uid=DIRECTORY, clock=clock, **config
            )
        )
        await stack.enter_async_context(directory)
        router = await directory.start(fab.sender(DIRECTORY))
        fab.attach(DIRECTORY, router.handle_pm)
        st = Stack(fab, directory, payer, clock, stack, data_dir)
        for who in (ADMIN, CALLER):
            await st.add_client(who)
        yield st
