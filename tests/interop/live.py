"""Live peers for the interop tests: the Go reference's harness and bridge
(``brmcp-goref harness|bridge`` attached through :class:`PipePeer`) and ours,
set up the same way so the two can be swapped and compared.

Both harnesses serve ``echo`` (free), ``fortune`` (10,000 atoms), ``dyn``
(250 atoms per unit, priced per call) and ``blob`` (free, returns a string of
the requested size); both bridges run in autopay with the same caps, token
and a clock fixed at :data:`START`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brmcp.bridge import Bridge, BridgeConfig, ManualClock, Settings
from brmcp.serve.tools import register_tools
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric
from brmcp.testing.pipe import PipePeer
from tests.kit import BOT, CLIENT, pm_parts

TOKEN = "interop-token-0123456789abcdef"
START = 1_800_000_000
NAME = "brmcp-bridge"
FORTUNE_PRICE = 10_000
DYN_UNIT = 250
PER_CALL_CAP = 100_000
PER_DAY_CAP = 1_000_000
BLOB_PATTERN = "0123456789abcdefghijklmnopqrstuvwxyz"

#: The tools/list ``_meta`` the Go reference advertises for these tools.
REFERENCE_META = {
    "echo": {"brmcp/priceAtoms": 0},
    "fortune": {"brmcp/priceAtoms": FORTUNE_PRICE},
    "dyn": {"brmcp/pricing": "dynamic"},
    "blob": {"brmcp/priceAtoms": 0},
}


def blob_data(n: int) -> str:
    """The ``blob`` tool's result string (the same as ``interop/go``'s)."""
    return (BLOB_PATTERN * (n // len(BLOB_PATTERN) + 1))[:n]


def bridge_settings() -> Settings:
    return Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=PER_CALL_CAP,
        per_day_cap_atoms=PER_DAY_CAP,
        allowed_bots=(BOT,),
    )


class Tap:
    """Records every PM on the fabric and decodes the JSON-RPC messages of
    each direction (single- and multi-part)."""

    def __init__(self) -> None:
        self.pms: list[tuple[str, str, str]] = []

    def __call__(self, from_uid: str, to_uid: str, text: str) -> None:
        self.pms.append((from_uid, to_uid, text))

    def messages(self, from_uid: str, to_uid: str) -> list[tuple[bytes, int]]:
        """``(payload, parts)`` for every complete message sent on that link."""
        chunks: dict[str, dict[int, bytes]] = {}
        out: list[tuple[bytes, int]] = []
        for f, t, text in self.pms:
            if (f, t) != (from_uid, to_uid):
                continue
            for part in pm_parts(text):
                got = chunks.setdefault(part.mid, {})
                got[part.seq] = part.chunk
                if len(got) == part.total:
                    out.append((b"".join(got[i] for i in range(1, part.total + 1)), part.total))
                    del chunks[part.mid]
        return out

    def json(self, from_uid: str, to_uid: str) -> list[dict[str, Any]]:
        return [json.loads(p) for p, _ in self.messages(from_uid, to_uid)]

    def calls(self, tool: str) -> list[dict[str, Any]]:
        """The tools/call requests for ``tool`` that CLIENT sent to BOT."""
        return [
            m
            for m in self.json(CLIENT, BOT)
            if m.get("method") == "tools/call" and m.get("params", {}).get("name") == tool
        ]


@dataclass
class GoHarness:
    peer: PipePeer

    def executions(self, tool: str) -> int:
        return sum(1 for kind, body in self.peer.controls if kind == "exec" and body.get("tool") == tool)

    async def credit(self, payer: str, atoms: int) -> int:
        reply = await self.peer.request("tip", {"from": payer, "atoms": atoms}, reply="credited")
        return int(reply["balance"])

    async def balance(self, of: str) -> int:
        reply = await self.peer.request("balance", {"uid": of}, reply="balance")
        return int(reply["balance"])


@dataclass
class PyHarness:
    harness: Harness
    counts: dict[str, int] = field(default_factory=dict)

    def executions(self, tool: str) -> int:
        return self.counts.get(tool, 0)

    async def credit(self, payer: str, atoms: int) -> int:
        await self.harness.credit(payer, atoms)
        return await self.balance(payer)

    async def balance(self, of: str) -> int:
        return await self.harness.balance(of)


@asynccontextmanager
async def go_harness(fabric: Fabric, binary: Path, data_dir: Path) -> AsyncIterator[GoHarness]:
    await anyio.Path(data_dir).mkdir(parents=True, exist_ok=True)
    argv = [str(binary), "harness", "-datadir", str(data_dir), "-allow", CLIENT]
    async with PipePeer(fabric, BOT, argv) as peer:
        await peer.next("ready")
        yield GoHarness(peer)


def build_py_harness(data_dir: Path, counts: dict[str, int], **config: Any) -> Harness:
    """Our harness with the example's ``echo``/``fortune`` plus ``dyn`` and
    ``blob``; ``config`` adds :class:`HarnessConfig` fields."""
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            allowed_peers={CLIENT},
            calls_per_minute=100_000,
            name="brmcp-example",
            version="0.1.0",
            **config,
        )
    )
    register_tools(harness)

    def counted(tool: str) -> None:
        counts[tool] = counts.get(tool, 0) + 1

    # Wrap the example's handlers to count executions.
    for spec in harness.tools():
        inner = spec.handler

        async def handler(
            ctx: CallContext, args: dict[str, Any], _inner: Any = inner, _name: str = spec.name
        ) -> Any:
            counted(_name)
            return await _inner(ctx, args)

        spec.handler = handler

    async def dyn_price(ctx: CallContext, args: dict[str, Any]) -> int:
        units = int(args.get("units", 0))
        if units < 1:
            raise ValueError("units must be at least 1")
        return units * DYN_UNIT

    async def dyn(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        counted("dyn")
        return {"units": int(args["units"]), "charged": ctx.charged_atoms}

    async def blob(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        counted("blob")
        return {"data": blob_data(int(args.get("bytes", 0)))}

    harness.add_tool(
        "dyn",
        dyn,
        description="Priced per call: 250 atoms per unit.",
        input_schema={"type": "object", "properties": {"units": {"type": "integer"}}},
        price=dyn_price,
    )
    harness.add_tool(
        "blob",
        blob,
        description="Return a string of the requested size.",
        input_schema={"type": "object", "properties": {"bytes": {"type": "integer"}}},
    )
    return harness


@asynccontextmanager
async def py_harness(fabric: Fabric, data_dir: Path, **config: Any) -> AsyncIterator[PyHarness]:
    counts: dict[str, int] = {}
    harness = build_py_harness(data_dir, counts, **config)
    async with harness:
        router = await harness.start(fabric.sender(BOT))
        fabric.attach(BOT, router.handle_pm)
        yield PyHarness(harness, counts)


@dataclass
class GoBridge:
    peer: PipePeer
    url: str
    data_dir: Path
    pays: list[tuple[str, int]] = field(default_factory=list)


@asynccontextmanager
async def go_bridge(
    fabric: Fabric, binary: Path, data_dir: Path, bot: GoHarness | PyHarness
) -> AsyncIterator[GoBridge]:
    """The reference bridge at CLIENT; its payer credits ``bot`` (as a
    confirmed tip would) and then reports the payment settled."""
    await anyio.Path(data_dir).mkdir(parents=True, exist_ok=True)
    pays: list[tuple[str, int]] = []
    holder: list[PipePeer] = []

    async def on_pay(body: dict[str, Any]) -> None:
        pays.append((body["payee"], int(body["atoms"])))
        error = ""
        if body["payee"] != BOT:
            error = "unknown payee"
        else:
            await bot.credit(CLIENT, int(body["atoms"]))
        await holder[0].send("settle", {"id": body["id"], "error": error})

    argv = [
        str(binary),
        "bridge",
        "-datadir",
        str(data_dir),
        "-bot",
        BOT,
        "-token",
        TOKEN,
        "-now",
        str(START),
        "-per-call-cap",
        str(PER_CALL_CAP),
        "-per-day-cap",
        str(PER_DAY_CAP),
    ]
    async with PipePeer(fabric, CLIENT, argv, handlers={"pay": on_pay}) as peer:
        holder.append(peer)
        ready = await peer.next("ready")
        yield GoBridge(peer, f"http://{ready['addr']}/mcp/{BOT}", data_dir, pays)


class PyPayer:
    def __init__(self, bot: GoHarness | PyHarness) -> None:
        self.bot = bot
        self.pays: list[tuple[str, int]] = []

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.pays.append((payee_uid, atoms))
        if payee_uid != BOT:
            raise RuntimeError("unknown payee")
        await self.bot.credit(CLIENT, atoms)


@dataclass
class PyBridge:
    bridge: Bridge
    url: str
    data_dir: Path
    payer: PyPayer

    @property
    def pays(self) -> list[tuple[str, int]]:
        return self.payer.pays


@asynccontextmanager
async def py_bridge(fabric: Fabric, data_dir: Path, bot: GoHarness | PyHarness) -> AsyncIterator[PyBridge]:
    await anyio.Path(data_dir).mkdir(parents=True, exist_ok=True)
    payer = PyPayer(bot)
    bridge = Bridge(
        BridgeConfig(
            data_dir=data_dir,
            sender=fabric.sender(CLIENT),
            payer=payer,
            listen="127.0.0.1:0",
            name=NAME,
            clock=ManualClock(START, auto=True),
        )
    )
    fabric.attach(CLIENT, bridge.handle_pm)
    async with bridge:
        await bridge.apply_settings(bridge_settings())
        address = bridge.listen_address
        with anyio.fail_after(10):
            while address is None:
                await anyio.sleep(0.01)
                address = bridge.listen_address
        yield PyBridge(bridge, f"http://{address[0]}:{address[1]}/mcp/{BOT}", data_dir, payer)


@asynccontextmanager
async def agent(url: str) -> AsyncIterator[ClientSession]:
    """A stock MCP SDK client on the bridge's endpoint (the agent's view).

    Both bridges answer a tools/call as one SSE event; the SDK refuses events
    over 1 MiB by default, so the limit is lifted for the ≥ 1 MiB results."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=None) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
