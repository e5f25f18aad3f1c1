"""The system under test: agent → proxy → bridge → fabric → harness.

``async with conformance_stack(workdir) as stack:`` starts, on loopback:

* an in-memory :class:`~brmcp.testing.Fabric` (the simulated relay);
* a :class:`~brmcp.server.Harness` bot at :data:`BOT` serving the fixture
  tools, resources, prompts and completion (``fixture.py``) to the bridge's
  uid only;
* a :class:`~brmcp.bridge.Bridge` at :data:`CLIENT` with its own listener,
  autopay, caps of 1 000 atoms per call and 100 000 per day, and a payer that
  credits the bot's ledger the way a confirmed tip would;
* a :class:`~.proxy.BearerProxy` in front of the bridge.

``stack.url`` is the proxy's ``/mcp/<bot uid>`` endpoint (no token needed);
``stack.direct_url`` the bridge's own (token required).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from brmcp.bridge import Bridge, BridgeConfig, Settings
from brmcp.server import Harness, HarnessConfig
from brmcp.testing import Fabric, uid

from .fixture import register_fixture_catalog, register_fixture_tools
from .proxy import BearerProxy

__all__ = ["BOT", "CLIENT", "TOKEN", "CreditingPayer", "Stack", "conformance_stack"]

BOT = uid(0xB)
CLIENT = uid(0xC)
TOKEN = "conformance-token-5f1d0c9a8b7e6d4c"


class CreditingPayer:
    """The bridge's payer: credits the bot's ledger with each payment (as
    a confirmed tip would) and records ``(payee, atoms)``."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.payments: list[tuple[str, int]] = []

    async def pay(self, payee_uid: str, atoms: int) -> None:
        if payee_uid != BOT:
            raise RuntimeError(f"unexpected payee {payee_uid}")
        self.payments.append((payee_uid, atoms))
        await self.harness.credit(CLIENT, atoms)


@dataclass
class Stack:
    fabric: Fabric
    harness: Harness
    bridge: Bridge
    payer: CreditingPayer
    proxy: BearerProxy

    @property
    def url(self) -> str:
        """The endpoint the suite talks to (through the proxy)."""
        return f"{self.proxy.base_url}/mcp/{BOT}"

    @property
    def direct_url(self) -> str:
        """The bridge's own endpoint (needs the bearer token)."""
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}/mcp/{BOT}"


@asynccontextmanager
async def conformance_stack(workdir: Path) -> AsyncIterator[Stack]:
    """Start the whole chain under ``workdir`` (bot and bridge data
    directories are created there) and tear it down on exit."""
    bridge_dir = workdir / "bridge"
    bridge_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=1_000,
        per_day_cap_atoms=100_000,
        allowed_bots=(BOT,),
    )
    (bridge_dir / "mcpclient.json").write_text(settings.to_json())
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        harness = Harness(
            HarnessConfig(
                data_dir=workdir / "bot",
                allowed_peers={CLIENT},
                calls_per_minute=100_000,
                name="brmcp-conformance-bot",
            )
        )
        register_fixture_tools(harness)
        register_fixture_catalog(harness)
        await stack.enter_async_context(harness)
        bot_router = await harness.start(fabric.sender(BOT))
        fabric.attach(BOT, bot_router.handle_pm)
        payer = CreditingPayer(harness)
        bridge = Bridge(
            BridgeConfig(data_dir=bridge_dir, sender=fabric.sender(CLIENT), payer=payer, listen="127.0.0.1:0")
        )
        fabric.attach(CLIENT, bridge.handle_pm)
        await stack.enter_async_context(bridge)
        address = bridge.listen_address
        assert address is not None
        proxy = await stack.enter_async_context(BearerProxy(f"http://{address[0]}:{address[1]}", TOKEN))
        yield Stack(fabric, harness, bridge, payer, proxy)
