from __future__ import annotations
import logging
from pathlib import Path
from typing import Any
import anyio, pytest
from mcp.shared.exceptions import MCPError
from brmcp.server import CallContext, Harness, HarnessConfig
from tests.kit.bridge import BOT, CLIENT, bridge_env, call

async def test_repro(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="brmcp")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env, env.session() as session:
            print([t.name for t in (await session.list_tools()).tools])
            print(await call(session, "free"))
            link = env.bridge.link(BOT)
            print("era", link.era)
            h = Harness(HarnessConfig(data_dir=str(tmp_path / "b2"), allowed_peers={CLIENT}, tools_list_changed=True))
            async def t(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
                return {"t": 1}
            h.add_tool("get_current_time", t, description="x", input_schema={"type": "object"})
            async with h:
                router = await h.start(env.fabric.sender(BOT))
                env.fabric.attach(BOT, router.handle_pm)
                t0 = anyio.current_time()
                try:
                    r = await call(session, "get_current_time")
                    print("OK", r)
                except MCPError as e:
                    print("ERR", e, anyio.current_time() - t0)
                print([t.name for t in (await session.list_tools()).tools])
    for r in caplog.records:
        print(r.name, r.getMessage()[:300])
