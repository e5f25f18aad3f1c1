from __future__ import annotations
import json, logging
from pathlib import Path
import anyio, pytest
from mcp.shared.exceptions import MCPError
from brmcp.serve import ServeApp
from brmcp.gateway import UpstreamConfig
from tests.kit.clientrpc import FAST, fake_network
from tests.kit.gateway import time_server_command, call
from tests.kit.serve import prepare_serve_dir
from tests.bridge.test_daemon import running_daemon, agent, bridge_settings, prepare_bridge_dir, FastPollClock
from brmcp.bridge import BridgeDaemon

async def test_repro(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="brmcp")
    with anyio.fail_after(120):
        async with fake_network(tmp_path / "br", "bot", "alice") as (relay, fakes):
            bot, alice = fakes
            d1 = tmp_path / "serve"
            prepare_serve_dir(d1, bot, [alice.uid])
            d2 = tmp_path / "gw"
            prepare_serve_dir(d2, bot, [alice.uid])
            (d2 / "prices.json").write_text(json.dumps({"default": "free", "tools": {"get_current_time": 0, "convert_time": 0}}))
            datadir = tmp_path / "bridge"
            prepare_bridge_dir(datadir, alice, bridge_settings(bot.uid))
            daemon = BridgeDaemon.from_datadir(datadir, listen="127.0.0.1:0", clock=FastPollClock(), client_options=FAST)
            async with anyio.create_task_group() as outer:
                await outer.start(daemon.run)
                await daemon.client.wait_connected()
                app = ServeApp.from_datadir(d1, client_options=FAST)
                scope1 = anyio.CancelScope()
                async def run1(task_status=anyio.TASK_STATUS_IGNORED):
                    with scope1:
                        await app.run(task_status=task_status)
                await outer.start(run1)
                await app.client.wait_connected()
                if True:
                    url = f"{daemon.base_url}/mcp/{bot.uid}"
                    async with agent(url) as s:
                        print([t.name for t in (await s.list_tools()).tools])
                        print((await s.call_tool("echo", {"text": "hi"})).is_error)
                        scope1.cancel(); await anyio.sleep(0.5)
                        print("swap")
                        app2 = ServeApp.from_datadir(d2, client_options=FAST, upstream=UpstreamConfig(command=tuple(time_server_command())))
                        async with anyio.create_task_group() as tg:
                            await tg.start(app2.run)
                            await app2.client.wait_connected()
                            await anyio.sleep(2)
                            t0 = anyio.current_time()
                            try:
                                r = await call(s, "get_current_time", {"timezone": "UTC"})
                                print("OK", r.is_error, anyio.current_time() - t0)
                            except MCPError as e:
                                print("ERR", e, anyio.current_time() - t0)
                            print([t.name for t in (await s.list_tools()).tools])
                            tg.cancel_scope.cancel()
                outer.cancel_scope.cancel()
    for r in caplog.records:
        print(r.created, r.name, r.getMessage()[:300])
