"""The brmcpdir daemon over fake brclients (brmcp/directory/cli.py
``serve_directory``; docs/directory.md §Running brmcpdir): a provider bot on
its own brclient registers and tips; the directory crawls and tests it with
a real brclient tip, charged once at the provider; plain chat gets the
how-to-connect reply."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
from mcp import ClientSession

from brmcp.directory import Directory, DirectoryConfig
from brmcp.directory.cli import ClientIntroducer, ClientTips, serve_directory
from brmcp.directory.model import STATE_PENDING_REVIEW
from brmcp.server import run_bot
from tests.kit import until
from tests.kit.clientrpc import FAST, fake_network

from .stack import BUDGET, FEE, PRICE, policy, provider_harness, register_args


async def test_daemon_verifies_a_provider_over_brclient(tmp_path: Path) -> None:
    async with fake_network(tmp_path / "br", "dir", "prov", "alice") as (_relay, fakes):
        dirf, provf, alicef = fakes
        harness, runs = provider_harness(tmp_path / "prov")
        dclient = dirf.client(**FAST)
        payer = ClientTips(dclient)
        directory = Directory(
            DirectoryConfig(tmp_path / "dir", policy(), payer, introducer=ClientIntroducer(dclient))
        )
        stop = anyio.Event()
        async with provf.client(**FAST) as pclient, anyio.create_task_group() as tg:
            prov_router = await tg.start(partial(run_bot, harness, pclient))
            await tg.start(partial(serve_directory, directory, dclient, payer, until=stop.wait))
            await until(lambda: directory.self_uid() == dirf.uid)

            conn = prov_router.dial(dirf.uid)
            async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=20) as s:
                await s.initialize()
                invoice = await s.call_tool("register", register_args())
                assert invoice.structured_content is not None
                assert invoice.structured_content["shortfallAtoms"] == FEE + BUDGET
            await pclient.tip_user(dirf.uid, (FEE + BUDGET) / 1e8, 3)

            async def judged() -> bool:
                return (await directory.pipeline.status(provf.uid)).state == STATE_PENDING_REVIEW

            await until(judged, limit=60)
            reg = await directory.store.registration(provf.uid)
            assert reg is not None
            assert reg.test_outcome == "ok", reg.test_err
            assert len(runs) == 1
            charges = [e.atoms for e in await harness.statement(dirf.uid) if e.kind == "charge"]
            assert charges == [-PRICE]
            assert await directory.harness.balance(provf.uid) == BUDGET - PRICE

            async with alicef.client(**FAST) as aclient:
                pms = aclient.pm_stream()
                await aclient.wait_connected()
                await pms.wait_open()
                await aclient.send_pm(dirf.uid, "hello?")
                with anyio.fail_after(20):
                    reply = await anext(aiter(pms))
                assert "directory of MCP tool providers" in reply.message
                assert dirf.uid in reply.message
                pms.close()
            stop.set()
            tg.cancel_scope.cancel()
