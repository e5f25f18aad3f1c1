"""The conformance system under test with a gateway bot: agent (the suite) →
bearer proxy → bridge → fabric → :class:`~brmcp.gateway.Gateway` → the
upstream ``@modelcontextprotocol/server-everything`` (stdio, pinned Node 22).

Same chain, uids, token and bridge settings as :mod:`.stack`; the bot is a
harness selling server-everything at :data:`GATEWAY_PRICES` instead of the
suite's fixture. ``stack.url`` is the proxy's ``/mcp/<bot uid>`` endpoint.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from brmcp.bridge import Bridge, BridgeConfig, Settings
from brmcp.gateway import Gateway, PriceTable, UpstreamConfig
from brmcp.server import Harness, HarnessConfig
from brmcp.testing import Fabric

from .nodetools import MODULES, NodeTools
from .proxy import BearerProxy
from .stack import BOT, CLIENT, TOKEN, CreditingPayer

__all__ = ["EVERYTHING", "GATEWAY_PRICES", "GatewayStack", "everything_argv", "gateway_conformance_stack"]

#: server-everything's entry script (installed by .ci/node-tools).
EVERYTHING = MODULES / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
#: prices.json of the gateway bot: two priced tools, the rest free.
GATEWAY_PRICES = PriceTable.parse(json.dumps({"default": "free", "tools": {"echo": 3, "get-sum": 5}}))


def everything_argv(tools: NodeTools) -> list[str] | None:
    """argv of server-everything (stdio) under the suite's Node, or None
    when it is not installed."""
    if not EVERYTHING.is_file():
        return None
    return [str(tools.node), str(EVERYTHING), "stdio"]


@dataclass
class GatewayStack:
    fabric: Fabric
    harness: Harness
    gateway: Gateway
    bridge: Bridge
    payer: CreditingPayer
    proxy: BearerProxy

    @property
    def url(self) -> str:
        return f"{self.proxy.base_url}/mcp/{BOT}"


@asynccontextmanager
async def gateway_conformance_stack(
    workdir: Path, upstream_argv: Sequence[str]
) -> AsyncIterator[GatewayStack]:
    """Start the chain under ``workdir`` and tear it down on exit."""
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
        errlog = stack.enter_context(open(workdir / "upstream.stderr", "w"))  # noqa: SIM115, ASYNC230
        fabric = await stack.enter_async_context(Fabric())
        harness = Harness(
            HarnessConfig(
                data_dir=workdir / "bot",
                allowed_peers={CLIENT},
                calls_per_minute=100_000,
                name="brmcp-conformance-gateway",
                tools_list_changed=True,
            )
        )
        gateway = Gateway(
            harness, UpstreamConfig(command=tuple(upstream_argv)), GATEWAY_PRICES, errlog=errlog
        )
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        await tg.start(gateway.run)
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
        yield GatewayStack(fabric, harness, gateway, bridge, payer, proxy)
