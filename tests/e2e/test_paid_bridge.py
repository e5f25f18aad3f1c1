"""The paid call end to end through the bridge, with faults.

Each test pins one failure of a paid call: a lost reply, a bot offline past
the deadline, a bot that never answers initialize, credit consumed by a
concurrent call, and an agent that goes away while its payment is parked or
in flight."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

import brmcp.bridge.pay._payloop as payloop
from brmcp import RouterOptions
from brmcp.bridge import ManualClock, RetryPolicy
from brmcp.bridge.links import no_answer_hint
from brmcp.bridge.pay import AGENT_GONE_PAID
from tests.kit import pm_messages
from tests.kit.bridge import (
    BOT,
    CLIENT,
    INIT,
    auth,
    bridge_env,
    call,
    fixture_settings,
    joined,
    texts,
    until,
)

FAST = RetryPolicy(initial=0.5, minimum=0.2, maximum=1.0, answer_timeout=1.0)


def _decoded(text: str) -> dict[str, Any] | None:
    """The PM's first single-part message that is a tool result, else its
    first message (a batch PM is dropped or kept whole)."""
    messages: list[dict[str, Any]] = pm_messages(text)  # type: ignore[assignment]
    for message in messages:
        if isinstance(message.get("result"), dict) and "structuredContent" in message["result"]:
            return message
    return messages[0] if messages else None


async def test_lost_result_is_recovered_by_a_resend_without_paying_twice(tmp_path: Path) -> None:
    """The bot's reply to the paid reissue is dropped: the bridge re-sends the
    same request (same callKey); the bot replays its outcome; one execution,
    one payment, and the agent gets the result."""
    async with bridge_env(tmp_path, retry=FAST) as env, env.session() as session:
        dropped: list[dict[str, Any]] = []

        def lossy(peer: str, text: str) -> None:
            message = _decoded(text)
            if (
                not dropped
                and message is not None
                and isinstance(message.get("result"), dict)
                and "structuredContent" in message["result"]
            ):
                dropped.append(message)
                return
            env.bridge.handle_pm(peer, text)

        env.fabric.attach(CLIENT, lossy)
        with anyio.fail_after(30):
            result = await call(session, "paid", {"text": "x"})
        assert result.structured_content == {"n": 1}
        assert dropped
        assert dropped[0]["result"]["structuredContent"] == {"n": 1}
        assert env.executions == {"paid": 1}
        assert env.payer.calls == [(BOT, 500)]
        assert await env.harness.balance(CLIENT) == 0
        link = env.bridge.link(BOT)
        assert link is not None
        assert link.resends >= 1


async def test_bot_offline_past_the_deadline_gets_a_clear_error_and_runs_nothing(tmp_path: Path) -> None:
    """The bot goes offline right after the payment: at the deadline (the
    message TTL) the agent gets an error saying what was paid; when the bot
    comes back every copy has expired, so the tool never runs for nobody and
    the credit stays at the bot."""
    options = RouterOptions(ttl=3.0)
    async with bridge_env(tmp_path, retry=FAST, router_options=options) as env, env.session() as session:
        # The reference order (refusal, payment, reissue): a held call paid
        # alongside would run as soon as the credit lands, before the bot vanishes.
        env.harness.config.hold_seconds = 0

        async def pay_then_vanish(payee: str, atoms: int) -> None:
            await env.payer.credit(payee, atoms)
            env.fabric.set_offline(BOT)

        env.payer.behaviour = pay_then_vanish
        with anyio.fail_after(30), pytest.raises(MCPError) as failure:
            await call(session, "paid", {"text": "x"})
        message = failure.value.error.message
        assert message.startswith(f"no reply from bot {BOT[:8]} within 3 s after ")
        assert message.endswith(
            "paid 500 atoms for this call (1 payment(s));"
            " credit the bot did not use stays there for later calls"
        )
        router = env.harness.router
        assert router is not None
        expired_before = router.stats.dropped_expired
        delivered_before = router.stats.messages_delivered
        held = env.fabric.stats.pms_stored  # what the bridge sent while the bot was away
        assert held > 0
        env.fabric.set_online(BOT)
        await until(lambda: env.fabric.stats.pms_delivered == env.fabric.stats.pms_sent)
        # Every PM held for the bot arrived expired and was dropped unread
        # (a batch PM counts once per part in it).
        assert router.stats.dropped_expired - expired_before >= held
        assert router.stats.messages_delivered == delivered_before
        assert env.executions == {}
        assert await env.harness.balance(CLIENT) == 500


class _WallSleepClock(ManualClock):
    """The fixture's clock, except that a sleep (the credit polls) takes real time."""

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        await super().sleep(seconds)


async def test_credit_polls_stop_before_the_deadline_and_say_what_was_paid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The payment is made but the bot never sees the credit: the polls after
    it would outlast the call's deadline, so they stop in time and the agent
    hears, in the result, what was paid and that the credit stays at the bot
    (not "no reply within 0 s after 0 send(s)")."""
    options = RouterOptions(ttl=2.0)
    monkeypatch.setattr(payloop, "POLL_INTERVAL", 2.5)
    clock = _WallSleepClock(1_800_000_000, auto=True)
    async with (
        bridge_env(tmp_path, retry=FAST, router_options=options, clock=clock) as env,
        env.session() as session,
    ):

        async def pay_without_credit(payee: str, atoms: int) -> None:
            return None  # paid, but the bot's ledger never sees it

        env.payer.behaviour = pay_without_credit
        # A bot that refuses at once (the reference order; no hold of the call paid alongside).
        env.harness.config.hold_seconds = 0
        with anyio.fail_after(30):
            result = await call(session, "paid", {"text": "x"})
        assert result.is_error
        assert texts(result)[-1] == (
            "brclientd: payment not made: already paid 500 atoms for this call and the bot still asks for"
            " payment; one call is paid once unless you approve more (approval mode); that credit stays at"
            " the bot for later calls"
        )
        assert "0 send(s)" not in joined(result)
        assert env.payer.calls == [(BOT, 500)]
        assert env.executions == {}


async def test_deadline_while_the_bot_holds_a_call_paid_alongside_counts_that_payment(tmp_path: Path) -> None:
    """The payment made alongside is confirmed but the bot never sees the
    credit; it holds the call past the call's deadline. The agent's error
    says the 500 atoms were paid (not "nothing was paid")."""
    options = RouterOptions(ttl=2.0)
    async with (
        bridge_env(tmp_path, retry=FAST, router_options=options) as env,
        env.session() as session,
    ):

        async def pay_without_credit(payee: str, atoms: int) -> None:
            return None  # paid, but the bot's ledger never sees it

        env.payer.behaviour = pay_without_credit
        env.harness.config.hold_seconds = 30  # longer than the 2 s deadline
        with anyio.fail_after(30), pytest.raises(MCPError) as failure:
            await call(session, "paid", {"text": "x"})
        message = failure.value.error.message
        assert message.startswith(f"no reply from bot {BOT[:8]} within 2 s")
        assert message.endswith(
            "; paid 500 atoms for this call (1 payment(s)); credit the bot did not use stays there for"
            " later calls"
        )
        assert env.payer.calls == [(BOT, 500)]
        assert env.executions == {}


async def test_unanswered_initialize_names_the_likely_causes(tmp_path: Path) -> None:
    """A bot that does not answer initialize: the agent hears why within
    answer_timeout, while the bridge keeps the dial going; once the bot is
    back the same dial completes."""
    async with bridge_env(tmp_path, retry=FAST, uid=CLIENT) as env:
        env.fabric.set_offline(BOT)
        async with env.http() as http:
            with anyio.fail_after(30):
                response = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
            assert response.status_code == 503
            body = response.json()
            assert body["id"] == 1
            assert body["error"]["message"] == no_answer_hint(BOT, 1.0, CLIENT)
            assert body["error"]["message"] == (
                f"no answer from bot {BOT} in 1 s: is it online, and is your uid {CLIENT}"
                " on its allowed_uids?"
            )
        env.fabric.set_online(BOT)
        with anyio.fail_after(30):
            async with env.session() as session:
                assert not (await call(session, "free")).is_error
        link = env.bridge.link(BOT)
        assert link is not None
        # The same first-contact dial completed, then the modern-era one.
        assert link.dials == 2


async def test_credit_used_by_a_concurrent_call_is_not_paid_for_twice(tmp_path: Path) -> None:
    """Call A pays; before its reissue reaches the bot another agent's call
    runs on that credit. A polls, then ends saying what it paid: one logical
    call is paid once in autopay (BRIDGE.md §The hard bound), never a bare
    refusal, and every atom paid bought a call."""
    async with bridge_env(tmp_path) as env, env.session() as first, env.session() as second:
        # The reference order (refusal, payment, reissue), which lets the other
        # call take the credit first: no payment alongside for this bot.
        await session_ready(env, first)
        env.bridge._proxies[BOT].funding = None
        stolen: list[str] = []

        async def pay_and_lose_the_credit(payee: str, atoms: int) -> None:
            await env.payer.credit(payee, atoms)
            if not stolen:
                other = await call(second, "paid", {"text": "other"})  # runs on A's credit
                stolen.append(texts(other)[0])

        env.payer.behaviour = pay_and_lose_the_credit
        with anyio.fail_after(30):
            result = await call(first, "paid", {"text": "x"})
        assert result.is_error
        assert texts(result)[-1].startswith(
            "brclientd: payment not made: already paid 500 atoms for this call and the bot still asks"
        )
        assert stolen
        assert json.loads(stolen[0]) == {"n": 1}
        assert env.payer.calls == [(BOT, 500)]
        assert env.executions == {"paid": 1}
        assert await env.harness.balance(CLIENT) == 0


async def session_ready(env: Any, session: Any) -> None:
    """The bot's proxy exists once a session reached it (its pre-flight)."""
    await until(lambda: BOT in env.bridge._proxies)


async def _open_session(http: httpx2.AsyncClient) -> str:
    response = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
    assert response.status_code == 200
    sid = response.headers["mcp-session-id"]
    notified = await http.post(
        f"/mcp/{BOT}",
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers={**auth(), "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"},
    )
    assert notified.status_code == 202
    return sid


def _tools_call(request_id: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "paid", "arguments": {"text": "x"}},
    }


async def test_agent_gone_withdraws_the_parked_approval(tmp_path: Path) -> None:
    """Approval mode: the agent's connection closes (no cancel) while its
    payment waits for the user; the parked payment disappears and can no
    longer be approved; nothing is paid or run."""
    settings = fixture_settings(mode="approval", approval_timeout_secs=600)
    async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.http() as http:
        sid = await _open_session(http)
        headers = {**auth(), "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
        with anyio.fail_after(30):
            async with http.stream("POST", f"/mcp/{BOT}", json=_tools_call(7), headers=headers) as response:
                assert response.status_code == 200
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                parked = env.bridge.pending_payments()[0]
            # The connection is closed here, with the call still waiting.
            await until(lambda: not env.bridge.pending_payments())
        assert not env.bridge.resolve_payment(parked.id, True)
        # The call is over at the bridge: nothing more is paid or sent for it.
        link = env.bridge.link(BOT)
        assert link is not None
        await until(lambda: link.relay.in_flight == 0)
        assert env.payer.calls == []
        assert env.executions == {}
        assert env.bridge.spend_log().entries == ()


async def test_payment_in_flight_when_the_agent_goes_away_completes_and_stays_as_credit(
    tmp_path: Path,
) -> None:
    """The agent's connection closes while the tip is in flight: the payment
    completes, the tool is not run for nobody, the credit stays at the bot,
    and the spend entry says so; a later call uses that credit."""
    async with bridge_env(tmp_path) as env, env.http() as http:
        release = anyio.Event()

        async def slow_tip(payee: str, atoms: int) -> None:
            await release.wait()
            await env.payer.credit(payee, atoms)

        env.payer.behaviour = slow_tip
        sid = await _open_session(http)
        headers = {**auth(), "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
        with anyio.fail_after(30):
            async with http.stream("POST", f"/mcp/{BOT}", json=_tools_call(8), headers=headers):
                await env.payer.entered.wait()
            link = env.bridge.link(BOT)
            assert link is not None
            # The agent counts as gone once it did not resume within the grace.
            await until(lambda: any(c.gone.is_set() for c in link.relay._calls.values()))
            release.set()
            await until(lambda: [e.status for e in env.bridge.spend_log().entries] == ["paid"])
        entry = env.bridge.spend_log().entries[0]
        assert (entry.atoms, entry.err) == (500, AGENT_GONE_PAID)
        # The call is over at the bridge; the later call below is the bot's
        # first execution (n == 1), so this one never ran.
        await until(lambda: link.relay.in_flight == 0)
        assert env.executions == {}
        assert await env.harness.balance(CLIENT) == 500
        env.payer.behaviour = None
        with anyio.fail_after(30):
            async with env.session() as session:
                result = await call(session, "paid", {"text": "later"})
        assert result.structured_content == {"n": 1}
        assert env.payer.calls == [(BOT, 500)]  # the later call paid nothing
        assert await env.harness.balance(CLIENT) == 0
