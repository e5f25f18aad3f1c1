"""The bridge's payment loop end to end: SDK client → bridge HTTP listener →
fabric → harness bot (BRIDGE.md §The payment flow, §Spend log and approvals; the
Go reference's ``bridge/bridge_test.go``, karamble/brmcp)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from brmcp import parse_payment_required
from brmcp.bridge import ManualClock
from brmcp.bridge.pay import arguments_hash
from tests.kit import pm_messages
from tests.kit.bridge import (
    BOT,
    CLIENT,
    INIT,
    NAME,
    START,
    auth,
    bridge_env,
    call,
    fixture_settings,
    texts,
    until,
)

DAY = 24 * 60 * 60


def _entry(ts: int, atoms: int, status: str = "", bot: str = BOT, tool: str = "paid") -> dict[str, Any]:
    out: dict[str, Any] = {"ts": ts, "bot": bot, "tool": tool, "rail": "tip", "atoms": atoms}
    if status:
        out["status"] = status
    return out


async def test_autopay_happy_path(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            result = await call(session, "paid", {"text": "hi"})
            assert not result.is_error
            assert result.structured_content == {"n": 1}
            assert env.executions == {"paid": 1}
            assert env.payer.calls == [(BOT, 500)]
            log = env.bridge.spend_log()
            (entry,) = [e.to_dict() for e in log.entries]
            # The logical call's callKey is recorded with the payment made alongside it.
            assert len(entry.pop("callKey")) == 32
            # ... and the hash of its arguments, which a retry after a crash matches.
            assert entry.pop("argsHash") == arguments_hash({"text": "hi"})
            # ... and that its call was answered: no later identical call takes it over.
            assert entry.pop("answered") is True
            assert entry == {
                "ts": START,
                "bot": BOT,
                "tool": "paid",
                "rail": "tip",
                "atoms": 500,
                "status": "paid",
            }
            assert log.day_total_atoms == 500
            assert await env.harness.balance(CLIENT) == 0
        reloaded = env.new_bridge()
        assert [e.status for e in reloaded.spend_log().entries] == ["paid"]
        assert reloaded.spend_log().day_total_atoms == 500


async def test_free_tool_never_pays(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            result = await call(session, "free")
            assert not result.is_error
            assert result.structured_content == {"ok": True}
            assert env.payer.calls == []
            assert env.bridge.spend_log().entries == ()


@pytest.mark.anyio  # explicit: conftest adds the marker too late for parametrized tests
@pytest.mark.parametrize("cap", [0, 499])
async def test_per_call_cap_refusals(tmp_path: Path, cap: int) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=fixture_settings(per_call_cap_atoms=cap)) as env:
            async with env.session() as session:
                result = await call(session, "paid", {"text": "hi"})
            assert result.is_error
            parts = texts(result)
            assert len(parts) == 2
            refusal = parse_payment_required(CallToolResult(content=result.content[:1], is_error=True))
            assert refusal is not None
            assert refusal.price_atoms == 500
            assert refusal.shortfall_atoms == 500
            assert parts[1] == f"brclientd: payment not made: 500 atoms exceeds the per-call cap ({cap})"
            assert env.payer.calls == []
            assert env.bridge.spend_log().entries == ()
            assert env.executions == {}


async def test_daily_cap_window(tmp_path: Path) -> None:
    settings = fixture_settings(per_call_cap_atoms=500, per_day_cap_atoms=1000)
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings) as env, env.session() as session:
            for n in (1, 2):
                result = await call(session, "paid", {"text": "x"})
                assert result.structured_content == {"n": n}  # exact fill is allowed
            third = await call(session, "paid", {"text": "x"})
            assert third.is_error
            assert texts(third)[-1] == (
                "brclientd: payment not made: 500 atoms would exceed the daily cap (1000 spent of 1000)"
            )
            env.clock.advance(25 * 3600)
            fourth = await call(session, "paid", {"text": "x"})
            assert fourth.structured_content == {"n": 3}
            assert env.bridge.spend_log().day_total_atoms == 500
            assert len(env.payer.calls) == 3


async def _parked(env: Any, count: int = 1) -> list[Any]:
    await until(lambda: len(env.bridge.pending_payments()) >= count)
    return env.bridge.pending_payments()


async def test_approval_flow(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(30):
        async with (
            bridge_env(tmp_path, settings=settings, auto_clock=False) as env,
            env.session() as session,
        ):
            results: list[CallToolResult] = []

            async def one_call() -> None:
                results.append(await call(session, "paid", {"text": "x"}))

            # Approve: the call completes and the queue drains.
            async with anyio.create_task_group() as tg:
                tg.start_soon(one_call)
                (pending,) = await _parked(env)
                assert (pending.bot, pending.tool, pending.atoms, pending.created) == (
                    BOT,
                    "paid",
                    500,
                    START,
                )
                assert len(pending.id) == 16
                assert env.bridge.resolve_payment(pending.id, True)
                assert env.bridge.resolve_payment(pending.id, False)  # ignored: the first decision wins
            assert results[-1].structured_content == {"n": 1}
            assert env.bridge.pending_payments() == []
            assert not env.bridge.resolve_payment(pending.id, True)

            # Deny.
            async with anyio.create_task_group() as tg:
                tg.start_soon(one_call)
                (pending,) = await _parked(env)
                assert env.bridge.resolve_payment(pending.id, False)
            assert results[-1].is_error
            assert texts(results[-1])[-1] == "brclientd: payment not made: payment denied by the user"

            # Timeout after 120 s on the bridge clock.
            async with anyio.create_task_group() as tg:
                tg.start_soon(one_call)
                await _parked(env)
                # The approval's timeout sleeps on the bridge clock; a second
                # short of it, it does not wake.
                await until(lambda: env.clock.sleepers == 1)
                env.clock.advance(119)
                assert env.clock.sleepers == 1
                assert len(env.bridge.pending_payments()) == 1
                env.clock.advance(1)
            assert texts(results[-1])[-1] == "brclientd: payment not made: approval timed out after 2m0s"
            assert env.bridge.pending_payments() == []
            assert not env.bridge.resolve_payment("0123456789abcdef", True)

            assert env.executions == {"paid": 1}
            assert len(env.bridge.spend_log().entries) == 1
            assert env.payer.calls == [(BOT, 500)]


async def test_approval_cannot_override_caps(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval", per_call_cap_atoms=100)
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.session() as session:
            result = await call(session, "paid", {"text": "x"})
            assert "exceeds the per-call cap (100)" in texts(result)[-1]
            assert env.bridge.pending_payments() == []


class _CreditOnSecondPoll(ManualClock):
    """Lands the bot credit during the second 3 s poll wait."""

    def __init__(self) -> None:
        super().__init__(START, auto=True)
        self.env: Any = None

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        if len(self.sleeps) == 2:
            await self.env.harness.credit(CLIENT, 500)


async def _pay_without_credit(payee: str, atoms: int) -> None:
    return None


async def test_paid_poll_late_credit(tmp_path: Path) -> None:
    clock = _CreditOnSecondPoll()
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, clock=clock) as env, env.session() as session:
            clock.env = env
            env.payer.behaviour = _pay_without_credit
            result = await call(session, "paid", {"text": "x"})
            assert result.structured_content == {"n": 1}
            assert env.executions == {"paid": 1}
            assert env.payer.calls == [(BOT, 500)]
            assert clock.sleeps == [3.0, 3.0]


async def test_paid_poll_exhaustion(tmp_path: Path) -> None:
    """A call whose credit never shows up at the bot is paid once (autopay:
    one payment per logical call), polled, then ends with a note saying what
    it paid; never a bare refusal."""
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            env.payer.behaviour = _pay_without_credit
            result = await call(session, "paid", {"text": "x"})
            assert result.is_error
            refusal = parse_payment_required(result)
            assert refusal is not None
            assert refusal.shortfall_atoms == 500
            assert texts(result)[-1] == (
                f"{NAME}: payment not made: already paid 500 atoms for this call and the bot still asks"
                " for payment; one call is paid once unless you approve more (approval mode); that"
                " credit stays at the bot for later calls"
            )
            assert env.payer.calls == [(BOT, 500)]
            assert env.executions == {}
            assert env.clock.sleeps == [3.0] * 5  # 6 reissues after the payment, 5 waits


async def test_transport_retry_once(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            assert not (await call(session, "free")).is_error
            link = env.bridge.link(BOT)
            assert link is not None
            # The first-contact sid, then the modern one.
            assert link.dials == 2
            env.fabric.fail_sends(CLIENT, 1)
            result = await call(session, "paid", {"text": "x"})
            assert result.structured_content == {"n": 1}
            assert link.dials == 3
            assert env.payer.calls == [(BOT, 500)]

            # The reset marked the tool snapshot stale: it is still served
            # (no warm-up on the new modern-era session) and refreshed in the
            # background after the next call.
            assert not (await call(session, "free")).is_error
            # Failing sends are re-sent (same callKey) on the
            # backoff until the deadline, so a short outage is survived.
            env.fabric.fail_sends(CLIENT, 2)
            assert not (await call(session, "free")).is_error
            assert link.dials == 5
            assert env.executions["free"] == 3


async def test_call_key_reused_on_reissue(tmp_path: Path) -> None:
    """The bridge owns the callKey: the agent's own _meta never reaches the
    bot, and the reissue after paying carries the same key."""
    seen: list[Any] = []
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            bot_router = env.harness.router
            assert bot_router is not None
            # Without holding, the call paid alongside is refused and reissued.
            env.harness.config.hold_seconds = 0

            def spy(peer: str, text: str) -> None:
                for message in pm_messages(text):
                    if message.get("method") == "tools/call":
                        params = message["params"]
                        assert isinstance(params, dict)
                        seen.append(params.get("_meta"))
                bot_router.handle_pm(peer, text)

            env.fabric.attach(BOT, spy)
            answered = bot_router.stats.messages_sent

            async def after_the_refusal(payee: str, atoms: int) -> None:
                # The tip lands once the bot answered the first send, so that
                # send is refused and reissued (not charged on arrival).
                await until(lambda: bot_router.stats.messages_sent > answered and len(seen) == 1)
                await env.payer.credit(payee, atoms)

            env.payer.behaviour = after_the_refusal
            async with env.session() as session:
                answered = bot_router.stats.messages_sent
                result = await session.call_tool(
                    "paid", {"text": "x"}, meta={"brmcp/callKey": "agent-chosen-key", "x": 1}
                )
            assert result.structured_content == {"n": 1}
    assert len(seen) == 2
    keys = {m["brmcp/callKey"] for m in seen}
    assert len(keys) == 1
    (key,) = keys
    assert key != "agent-chosen-key"
    assert len(key) == 32
    assert int(key, 16) >= 0
    # Besides the key: the modern era's envelope keys (io.modelcontextprotocol/*)
    # and the bridge's own pay-alongside mark and process epoch (one for both);
    # the transport's batch mark (WIRE.md §Batches) is its router's, not the bridge's.
    own = [
        {k for k in m if not k.startswith("io.modelcontextprotocol/")} - {"brmcp/payAlongside", "brmcp/batch"}
        for m in seen
    ]
    assert all(keys == {"brmcp/callKey", "brmcp/callerEpoch"} for keys in own)
    assert len({m["brmcp/callerEpoch"] for m in seen}) == 1


async def test_mirror_fidelity(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            listed = {t.name: t for t in (await session.list_tools()).tools}
            assert listed["paid"].meta == {"brmcp/priceAtoms": 500}
            assert listed["free"].meta == {"brmcp/priceAtoms": 0}
            assert listed["dyn"].meta == {"brmcp/pricing": "dynamic"}
            schema = listed["paid"].input_schema
            assert set(schema["properties"]) == {"text", "count"}
            assert schema["properties"]["text"]["description"] == "the text"
            link = env.bridge.link(BOT)
            assert link is not None
            assert link.tools is not None
            direct = [t.model_dump(by_alias=True, exclude_none=True) for t in link.tools]
            mirrored = [t.model_dump(by_alias=True, exclude_none=True) for t in listed.values()]
            assert mirrored == direct
            with pytest.raises(MCPError) as unknown:
                await call(session, "nope")
            assert unknown.value.error.message == 'unknown tool "nope"'


async def test_tools_list_is_served_from_the_snapshot(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            await session.list_tools()
            before = env.fabric.stats.pms_delivered
            for _ in range(3):
                await session.list_tools()
            assert env.fabric.stats.pms_delivered == before
            await call(session, "free")
            assert env.fabric.stats.pms_delivered == before + 2


async def test_spend_prune_preserves_window(tmp_path: Path) -> None:
    seeded = [_entry(START - 60, 1, "paid") for _ in range(1500)]
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, spend_entries=seeded) as env, env.session() as session:
            await call(session, "paid", {"text": "x"})
            log = env.bridge.spend_log()
            assert len(log.entries) == 1501
            assert log.day_total_atoms == 1500 + 500
            assert len(_on_disk(env)) == 1501
            env.clock.advance(25 * 3600)
            await call(session, "paid", {"text": "x"})
            log = env.bridge.spend_log()
            assert len(log.entries) == 1000
            assert log.day_total_atoms == 500
            assert len(_on_disk(env)) == 1000


async def test_pay_failure_not_counted(tmp_path: Path) -> None:
    async def no_route(payee: str, atoms: int) -> None:
        raise RuntimeError("no route to bot")

    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            env.payer.behaviour = no_route
            result = await call(session, "paid", {"text": "x"})
            assert texts(result)[-1] == "brclientd: payment not made: no route to bot"
            (entry,) = env.bridge.spend_log().entries
            assert (entry.status, entry.err) == ("failed", "no route to bot")
            assert env.bridge.spend_log().day_total_atoms == 0
            assert _on_disk(env)[0]["err"] == "no route to bot"


async def test_pay_timeout_stays_counted(tmp_path: Path) -> None:
    async def never(payee: str, atoms: int) -> None:
        await anyio.sleep_forever()

    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=fixture_settings(tip_wait_secs=1)) as env:
            async with env.session() as session:
                env.payer.behaviour = never
                result = await call(session, "paid", {"text": "x"})
            assert "payment not made: tip not confirmed within 1s" in texts(result)[-1]
            (entry,) = env.bridge.spend_log().entries
            assert entry.status == "pending"
            assert env.bridge.spend_log().day_total_atoms == 500


async def test_resolve_spend_late_failure(tmp_path: Path) -> None:
    settings = fixture_settings(per_call_cap_atoms=500, per_day_cap_atoms=500)
    with anyio.fail_after(30):
        async with (
            bridge_env(tmp_path, settings=settings, spend_entries=[_entry(START - 5, 500, "pending")]) as env,
            env.session() as session,
        ):
            # The pending payment's outcome is unknown: a call for this tool
            # waits for it (within its deadline) rather than paying again, and
            # pays anew once brclient reports that the tip failed.
            assert not await env.bridge.resolve_spend(CLIENT, 500, "no route")
            assert not await env.bridge.resolve_spend(BOT, 499, "no route")
            results: list[Any] = []

            async def agent() -> None:
                results.append(await call(session, "paid", {"text": "x"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(agent)
                await anyio.wait_all_tasks_blocked()
                assert env.payer.calls == []
                assert await env.bridge.resolve_spend(BOT.upper(), 500, "no route")
            (ok,) = results
            assert ok.structured_content == {"n": 1}
            assert env.payer.calls == [(BOT, 500)]
            assert not await env.bridge.resolve_spend(BOT, 500, "no route")
            failed = [e for e in env.bridge.spend_log().entries if e.status == "failed"]
            assert [(e.atoms, e.err) for e in failed] == [(500, "no route")]
            assert env.bridge.spend_log().day_total_atoms == 500
        reloaded = env.new_bridge().spend_log()
        assert [e.status for e in reloaded.entries] == ["failed", "paid"]
        assert reloaded.day_total_atoms == 500


async def test_resolve_spend_late_paid(tmp_path: Path) -> None:
    seeded = [_entry(START - 5, 500, "pending"), _entry(START - 4, 700, "pending")]
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, spend_entries=seeded) as env:
            assert await env.bridge.resolve_spend(BOT, 500, None)
            statuses = [(e.status, e.err) for e in env.bridge.spend_log().entries]
            assert statuses == [("paid", ""), ("pending", "")]
            assert env.bridge.spend_log().day_total_atoms == 1200
        fresh = env.new_bridge()
        assert await fresh.resolve_spend(BOT, 700, None)
        assert [e.status for e in fresh.spend_log().entries] == ["paid", "paid"]
        assert [e["status"] for e in _on_disk(env)] == ["paid", "paid"]


async def test_resolve_spend_oldest_first(tmp_path: Path) -> None:
    seeded = [_entry(START - 20, 500, "pending", tool="a"), _entry(START - 10, 500, "pending", tool="b")]
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, spend_entries=seeded) as env:
            assert await env.bridge.resolve_spend(BOT, 500, None)
            assert await env.bridge.resolve_spend(BOT, 500, "late failure")
            entries = env.bridge.spend_log().entries
            assert [(e.tool, e.status, e.err) for e in entries] == [
                ("a", "paid", ""),
                ("b", "failed", "late failure"),
            ]
            assert env.bridge.spend_log().day_total_atoms == 500


async def test_prune_protects_pending(tmp_path: Path) -> None:
    stale = START - 2 * DAY
    seeded = [_entry(stale + i, 1) for i in range(1500)]
    seeded[300] = _entry(stale + 300, 2, "pending")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, spend_entries=seeded) as env, env.session() as session:
            await call(session, "paid", {"text": "x"})
            entries = env.bridge.spend_log().entries
            assert len(entries) == 1201
            assert (entries[0].atoms, entries[0].status) == (2, "pending")
            assert not await env.bridge.resolve_spend(BOT, 1, None)  # legacy entries are never claimed
            assert await env.bridge.resolve_spend(BOT, 2, None)


async def test_unreachable_bot_is_503(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            env.fabric.fail_sends(CLIENT)
            async with env.http() as http:
                response = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
                assert response.status_code == 503
                assert response.text == "bot unavailable\n"
                assert response.headers["content-type"] == "text/plain; charset=utf-8"
            env.fabric.restore_sends(CLIENT)
            async with env.session() as session:
                assert not (await call(session, "free")).is_error


def _on_disk(env: Any) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((env.data_dir / "mcpspend.json").read_text())
    return data


async def test_expired_bot_session_recovers_transparently(tmp_path: Path) -> None:
    """The bot forgot the session (idle expiry): the next call's error resets
    the link and the retry on a fresh session succeeds
    (BRIDGE.md §The payment flow, "Transport errors")."""
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            assert not (await call(session, "free")).is_error
            bot_router = env.harness.router
            assert bot_router is not None
            link = env.bridge.link(BOT)
            assert link is not None
            for conn in [c for c in list(bot_router._sessions.values()) if c.peer == CLIENT]:
                conn.close()
            result = await call(session, "paid", {"text": "x"})
            assert result.structured_content == {"n": 1}
            # A modern-era session needs no initialize: the bot simply opens a
            # new session under the same sid, with no reset and no extra PM
            # (the dials: the first-contact sid, then the modern one).
            assert link.dials == 2
            assert env.payer.calls == [(BOT, 500)]
