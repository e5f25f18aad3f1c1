"""Spending can never pass the caps: concurrent calls race for the daily
budget, and a leaked agent token buys no more than the caps allow and cannot
reach the admin surface (BRIDGE.md §Security model; SECURITY.md §3)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
from mcp.types import CallToolResult

from tests.kit.bridge import BOT, CLIENT, TOKEN, bridge_env, call, fixture_settings, texts, until


async def test_fifty_concurrent_paid_calls_never_pass_the_daily_cap(tmp_path: Path) -> None:
    settings = fixture_settings(per_call_cap_atoms=500, per_day_cap_atoms=10_000)
    results: list[CallToolResult] = []
    with anyio.fail_after(120):
        async with bridge_env(tmp_path, settings=settings) as env, env.session() as session:
            await session.list_tools()

            async def one() -> None:
                results.append(await call(session, "paid", {"text": "x"}))

            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(one)

            log = env.bridge.spend_log()
            paid = [e for e in log.entries if e.status == "paid"]
            assert log.day_total_atoms <= 10_000
            assert sum(atoms for _, atoms in env.payer.calls) <= 10_000
            assert len(env.payer.calls) == len(log.entries) == len(paid) <= 20
            succeeded = [r for r in results if not r.is_error]
            refused = [r for r in results if r.is_error]
            assert len(results) == 50
            assert len(succeeded) == env.executions.get("paid", 0)
            for result in refused:
                last = texts(result)[-1]
                # A cap refusal, or a call that paid while a concurrent call spent its
                # credit: one call is paid once (BRIDGE.md §The hard bound), so it ends
                # saying so and its credit stays at the bot.
                assert "would exceed the daily cap" in last or "already paid 500 atoms for this call" in last
            # Every atom paid bought a call or stays at the bot as credit, to the atom.
            assert await env.harness.balance(CLIENT) + 500 * len(succeeded) == 500 * len(paid)
            assert len(paid) == 20  # the budget is used exactly to its cap


async def test_leaked_token_spends_no_more_than_the_caps(tmp_path: Path) -> None:
    settings = fixture_settings(per_call_cap_atoms=500, per_day_cap_atoms=2_000)
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings) as env:
            # The holder of the agent token opens many sessions and retries.
            outcomes = []
            for _ in range(3):
                async with env.session(token=TOKEN) as session:
                    for _ in range(4):
                        outcomes.append(await call(session, "paid", {"text": "x"}))
            assert sum(1 for r in outcomes if not r.is_error) == 4
            assert env.bridge.spend_log().day_total_atoms == 2_000
            assert len(env.payer.calls) == 4

            # ... and cannot reach the admin surface to lift the caps.
            async with env.http() as http:
                agent = {"Authorization": f"Bearer {TOKEN}"}
                raise_caps = {"per_day_cap_atoms": 10**12, "per_call_cap_atoms": 10**12}
                response = await http.put("/admin/settings", json=raise_caps, headers=agent)
                assert response.status_code == 401
                assert (await http.get("/admin/approvals", headers=agent)).status_code == 401
                assert (await http.get("/admin/settings", headers=agent)).status_code == 401
            on_disk = json.loads((env.data_dir / "mcpclient.json").read_text())
            assert on_disk["per_day_cap_atoms"] == 2_000
            assert env.bridge.settings.per_day_cap_atoms == 2_000


async def test_leaked_token_cannot_approve_its_own_payments(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(30):
        async with (
            bridge_env(tmp_path, settings=settings, auto_clock=False) as env,
            env.session() as session,
            env.http() as http,
        ):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, session, "paid", {"text": "x"})
                await until(lambda: bool(env.bridge.pending_payments()))
                (pending,) = env.bridge.pending_payments()
                agent = {"Authorization": f"Bearer {TOKEN}"}
                attempt = await http.post(f"/admin/approvals/{pending.id}/approve", headers=agent)
                assert attempt.status_code == 401
                assert env.bridge.pending_payments() == [pending]
                assert env.bridge.resolve_payment(pending.id, False)
            assert env.payer.calls == []
            assert env.executions == {}


async def test_admin_token_does_not_open_mcp(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            response = await http.post(
                f"/mcp/{BOT}",
                json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                headers={
                    "Authorization": f"Bearer {env.bridge.admin_token}",
                    "Content-Type": "application/json",
                },
            )
            assert response.status_code == 401
