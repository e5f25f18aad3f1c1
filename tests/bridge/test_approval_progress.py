"""While a payment waits for the user's approval, an agent that asked for
progress hears from the bridge every APPROVAL_PROGRESS_INTERVAL seconds, so
clients that restart their request timeout on progress keep waiting
(brmcp/bridge/pay/_decide.py ``Decider.approval_progress``; BRIDGE.md "Agent timeouts").

Uses the shared bridge fixture (tests/kit/bridge.py) in approval mode
with a manual clock: time moves only when the test advances it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult, ProgressNotification

from brmcp.bridge.pay import APPROVAL_PROGRESS_INTERVAL, APPROVAL_PROGRESS_STEP, PendingPayment
from brmcp.protocol.payment import PaymentRequired
from tests.kit.bridge import BOT, bridge_env, fixture_settings, until

Seen = list[tuple[float, float | None, str | None]]


def _request() -> CallToolRequest:
    return CallToolRequest(params=CallToolRequestParams(name="paid", arguments={"text": "x"}))


def _reminders(env: Any) -> int:
    """How often the keepalive has gone to sleep on the bridge clock."""
    return int(env.clock.sleeps.count(APPROVAL_PROGRESS_INTERVAL))


async def _next_reminder(env: Any, seen: Seen, count: int) -> None:
    """Advance the clock by one interval once the keepalive sleeps (so the
    step wakes it exactly once) and wait for notification number ``count``."""
    await until(lambda: _reminders(env) == count - 1)
    env.clock.advance(APPROVAL_PROGRESS_INTERVAL)
    await until(lambda: len(seen) == count)


async def test_a_parked_payment_sends_progress_until_it_is_approved(tmp_path: Path) -> None:
    seen: Seen = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    settings = fixture_settings(mode="approval")
    with anyio.fail_after(30):
        async with (
            bridge_env(tmp_path, settings=settings, auto_clock=False) as env,
            env.session() as session,
        ):
            release = anyio.Event()

            async def slow_tip(payee: str, atoms: int) -> None:
                await release.wait()
                await env.payer.credit(payee, atoms)

            env.payer.behaviour = slow_tip
            results: list[CallToolResult] = []

            async def one_call() -> None:
                results.append(
                    await session.send_request(_request(), CallToolResult, progress_callback=on_progress)
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(one_call)
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (pending,) = env.bridge.pending_payments()
                # The first notification goes out as soon as the payment is parked.
                await until(lambda: len(seen) == 1)
                for n in (2, 3, 4):
                    await _next_reminder(env, seen, n)

                values = [p for p, _, _ in seen]
                assert values == sorted(set(values))  # strictly increasing
                assert values[0] == APPROVAL_PROGRESS_STEP
                assert all(total is None for _, total, _ in seen)
                texts = [m or "" for _, _, m in seen]
                assert texts[0] == (
                    f"waiting for the user to approve or deny a payment of 500 atoms to bot {BOT[:8]}"
                    f" for paid (payment {pending.id}, 2m0s left)"
                )
                # The agent is not told how to approve: the user decides, not the agent.
                assert not any("brmcp-bridge" in t or "approvals" in t for t in texts)
                assert [t.rsplit(", ", 1)[1].split(" left")[0] for t in texts] == [
                    "2m0s",
                    "1m50s",
                    "1m40s",
                    "1m30s",
                ]

                # The decision stops the notifications at once, though the
                # call goes on (the tip is still being made): the keepalive,
                # asleep on the bridge clock, is gone with the wait, so
                # nothing sleeps on the clock for time to wake.
                await until(lambda: _reminders(env) == 4)
                assert env.bridge.resolve_payment(pending.id, True)
                await env.payer.entered.wait()
                await until(lambda: env.clock.sleepers == 0)
                sleeping = _reminders(env)
                for _ in range(3):
                    env.clock.advance(APPROVAL_PROGRESS_INTERVAL)
                assert len(seen) == 4
                assert _reminders(env) == sleeping
                release.set()
            (result,) = results
            assert result.structured_content == {"n": 1}
            assert len(seen) == 4
            assert env.payer.calls == [(BOT, 500)]


async def test_no_progress_is_sent_without_a_progress_token(tmp_path: Path) -> None:
    notifications: list[Any] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, ProgressNotification):
            notifications.append(message)

    settings = fixture_settings(mode="approval")
    with anyio.fail_after(30):
        async with (
            bridge_env(tmp_path, settings=settings, auto_clock=False) as env,
            env.session(message_handler=on_message) as session,
        ):
            results: list[CallToolResult] = []

            async def one_call() -> None:
                results.append(await session.send_request(_request(), CallToolResult))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one_call)
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (pending,) = env.bridge.pending_payments()
                # Only the approval's own timeout sleeps on the bridge clock.
                await until(lambda: env.clock.sleepers == 1)
                for _ in range(3):
                    env.clock.advance(APPROVAL_PROGRESS_INTERVAL)
                assert env.bridge.resolve_payment(pending.id, True)
            # The call is over: a keepalive would have slept on the clock by now.
            assert results[0].structured_content == {"n": 1}
            assert _reminders(env) == 0
            assert notifications == []


async def test_the_notifications_stop_when_the_agent_goes_away(tmp_path: Path) -> None:
    seen: Seen = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    settings = fixture_settings(mode="approval")
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env:
            async with env.session() as session, anyio.create_task_group() as tg:

                async def one_call() -> None:
                    await session.send_request(_request(), CallToolResult, progress_callback=on_progress)

                tg.start_soon(one_call)
                await until(lambda: len(seen) == 1)
                await until(lambda: _reminders(env) == 1)
                # The agent cancels its call (notifications/cancelled).
                tg.cancel_scope.cancel()
            await until(lambda: env.bridge.pending_payments() == [])
            # The keepalive ended with the wait: nothing sleeps on the bridge
            # clock, so time passing wakes nothing.
            await until(lambda: env.clock.sleepers == 0)
            for _ in range(3):
                env.clock.advance(APPROVAL_PROGRESS_INTERVAL)
            assert _reminders(env) == 1
            assert len(seen) == 1
            assert env.payer.calls == []


async def test_a_failing_companion_does_not_end_the_wait_for_the_decision(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env:
            settler = env.bridge._settler
            started: list[tuple[PendingPayment, float]] = []

            async def broken(payment: PendingPayment, expires: float) -> None:
                started.append((payment, expires))
                raise RuntimeError("the agent's stream is closed")

            reasons: list[str | None] = []

            async def pay() -> None:
                refusal = PaymentRequired(tool="paid", price_atoms=500, balance_atoms=0, shortfall_atoms=500)
                reasons.append(await settler.settle(BOT, "paid", refusal, while_parked=broken))

            async with anyio.create_task_group() as tg:
                tg.start_soon(pay)
                await until(lambda: len(started) == 1)
                (payment, expires) = started[0]
                assert expires == env.clock.now() + settings.approval_timeout_secs
                assert [p.id for p in env.bridge.pending_payments()] == [payment.id]
                assert env.bridge.resolve_payment(payment.id, False)
            assert reasons == ["payment denied by the user"]
