"""A ``TipUser`` whose reply the clientrpc connection lost (BRIDGE.md
§Failures, SECURITY.md section 7): the bridge cannot know whether brclient
took the tip, so the spend entry is not marked as taken by the wallet until
a TipProgress event for the tip proves it; without one the doubt blocks the
tool only for ``tip_wait_secs`` from the payment, and a retry of the call is
paid and answered, charged once. When brclient did take the tip, its
outcome after the reconnect settles the entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp.types import CallToolResult

from brmcp import PaymentRequired
from brmcp.bridge import BridgeDaemon, ManualClock, Settings, TipMatcher, TipPayer
from brmcp.bridge.pay import SPEND_FILE, Settler, SpendLog
from brmcp.clientrpc import Client, ClientrpcConnectionLost
from brmcp.protocol.units import milliatoms_from_atoms
from brmcp.testing.fakebr import FakeBRClient
from tests.bridge.test_daemon import agent, bridge_settings, running_daemon
from tests.kit.serve import ServeEnv, serve_network, until

TIP_USER = "PaymentsService.TipUser"
PRICE = 10_000
#: The bridge's tip wait in these tests (seconds): short, so the doubt's
#: window passes quickly.
TIP_WAIT = 2


def _tips_asked(alice: FakeBRClient) -> int:
    return sum(1 for method, _ in alice.requests if method == TIP_USER)


async def _lose_the_tip_reply(env: ServeEnv, daemon: BridgeDaemon) -> None:
    """Hold alice's next ``TipUser`` until the bridge sent it, then abort the
    bridge's websocket: brclient read the request, the bridge gets no reply."""
    alice = env.alice
    before = _tips_asked(alice)
    await until(lambda: _tips_asked(alice) > before)
    alice.drop_connections()
    await until(lambda: daemon.client.connections >= 2 and daemon.client.connected)
    alice.release(TIP_USER)


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


async def test_a_tip_never_taken_blocks_the_retry_only_for_the_tip_wait(tmp_path: Path) -> None:
    """The drop cancels the held ``TipUser`` at brclient: no tip is ever made
    and no TipProgress event ever comes. The first call ends after the tip
    wait with the payment not made; the agent's retry (same arguments) is
    paid, answered and charged once, instead of being refused as "still in
    doubt" for a day."""
    with anyio.fail_after(90):
        async with serve_network(tmp_path) as env:
            bot, alice, harness = env.bot, env.alice, env.app.harness
            settings = bridge_settings(bot.uid, tip_wait_secs=TIP_WAIT)
            async with running_daemon(env, tmp_path / "bridge", settings) as daemon:
                url = f"{daemon.base_url}/mcp/{bot.uid}"
                alice.hold(TIP_USER)
                async with agent(url) as s, anyio.create_task_group() as tg:
                    tg.start_soon(_lose_the_tip_reply, env, daemon)
                    first = await s.call_tool("fortune", {})
                assert "payment not made: tip not confirmed within 2s" in _text(first)
                [lost] = daemon.bridge.spend_log().entries
                assert lost.status == "pending"
                assert _tips_asked(alice) == 1
                # The agent retries once the tip wait of the lost payment has passed.
                await until(lambda: daemon.bridge.clock_now() > lost.ts + TIP_WAIT + 1, 10)
                with anyio.fail_after(20):  # well inside the call's deadline
                    async with agent(url) as s:
                        second = await s.call_tool("fortune", {})
                assert not second.is_error, _text(second)
                assert "payment not made" not in _text(second)
                entries = daemon.bridge.spend_log().entries
                assert [e.status for e in entries] == ["pending", "paid"]
                # Nothing said the wallet took the lost one: it stays pending
                # (counted in the day's total), not marked as taken.
                assert not entries[0].scheduled
                # The books to the atom: one tip left the wallet, the bot booked
                # it and charged it once, for the result the agent received.
                assert _tips_asked(alice) == 2
                statement = await harness.statement(alice.uid)
                assert sorted((e.kind, e.atoms) for e in statement) == [("charge", -PRICE), ("tip", PRICE)]
                assert await harness.balance(alice.uid) == 0


async def test_a_tip_taken_despite_the_lost_reply_settles_by_its_outcome(tmp_path: Path) -> None:
    """brclient took the tip although its reply was lost: the TipProgress
    stream, reopened after the reconnect, carries its outcome. A first
    event saying the attempt is retried later proves the wallet took it (the
    entry is marked so, and stays pending); its completion settles it paid."""
    with anyio.fail_after(90):
        async with serve_network(tmp_path) as env:
            bot, alice = env.bot, env.alice
            settings = bridge_settings(bot.uid, tip_wait_secs=60)
            async with running_daemon(env, tmp_path / "bridge", settings) as daemon:
                url = f"{daemon.base_url}/mcp/{bot.uid}"
                alice.hold(TIP_USER)
                matoms = milliatoms_from_atoms(PRICE)

                async def taken_then_retried() -> None:
                    await _lose_the_tip_reply(env, daemon)
                    alice.emit_tip_progress(
                        bot.uid, matoms, attempt=1, attempt_err="payee offline", will_retry=True
                    )

                async with agent(url) as s, anyio.create_task_group() as tg:
                    tg.start_soon(taken_then_retried)
                    first = await s.call_tool("fortune", {})
                assert "brclient retries it later, so it may still land" in _text(first)
                [entry] = daemon.bridge.spend_log().entries
                assert (entry.status, entry.scheduled) == ("pending", True)
                alice.emit_tip_progress(bot.uid, matoms, attempt=2, completed=True)
                await until(lambda: daemon.bridge.spend_log().entries[0].status == "paid")


# -- the payer's rule, every case -------------------------------------------------------

BOT = "c" * 64
#: What brclient reports for the tip after ``TipUser``: nothing, a first
#: attempt it retries later, its completion, or its final failure.
EVENTS = ("none", "retried", "completed", "failed")


class _Brclient:
    """A connected brclient whose ``TipUser`` reports ``event`` for the tip
    (to the matcher, as the daemon's progress loop does), then returns, or
    loses its reply (``reply_lost``)."""

    connected = True

    def __init__(self, matcher: TipMatcher, reply_lost: bool, event: str) -> None:
        self._matcher = matcher
        self._reply_lost = reply_lost
        self._event = event
        self.tips = 0

    async def wait_connected(self) -> None:
        return None

    async def tip_user(self, uid_hex: str, dcr_amount: float, max_attempts: int) -> None:
        self.tips += 1
        matoms = milliatoms_from_atoms(round(dcr_amount * 1e8))
        if self._event == "retried":
            self._matcher.stall(uid_hex, matoms, "payee offline")
        elif self._event == "completed":
            self._matcher.resolve(uid_hex, matoms, None)
        elif self._event == "failed":
            self._matcher.resolve(uid_hex, matoms, "no route")
        if self._reply_lost:
            raise ClientrpcConnectionLost("brclient connection lost before the reply to TipUser")


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("reply_lost", [False, True], ids=["reply", "reply-lost"])
async def test_the_entry_is_marked_taken_only_when_brclient_is_known_to_have_the_tip(
    tmp_path: Path, reply_lost: bool, event: str
) -> None:
    """The spend entry says the wallet took the tip (``scheduled``, which
    makes its doubt last a day) exactly when that is known: ``TipUser``
    returned, or a progress event for the tip came. Its status follows the
    outcome; without one it stays pending and counted."""
    matcher = TipMatcher()
    brclient = _Brclient(matcher, reply_lost, event)
    payer = TipPayer(cast(Client, cast(Any, brclient)), matcher, reconnect_wait=0)
    settings = Settings(
        enabled=True,
        token="t" * 32,
        mode="autopay",
        per_call_cap_atoms=PRICE,
        per_day_cap_atoms=10 * PRICE,
        allowed_bots=(BOT,),
        tip_wait_secs=1,
    )
    path = tmp_path / SPEND_FILE
    settler = Settler(
        spend=SpendLog.load(path),
        payer=payer,
        clock=ManualClock(1_800_000_000, auto=True),
        settings=lambda: settings,
    )
    refusal = PaymentRequired(tool="fortune", price_atoms=PRICE, balance_atoms=0, shortfall_atoms=PRICE)
    with anyio.fail_after(10):
        reason = await settler.settle(BOT, "fortune", refusal)
    [entry] = settler.summary().entries
    assert brclient.tips == 1
    assert entry.scheduled == (not reply_lost or event != "none")
    status = {"none": "pending", "retried": "pending", "completed": "paid", "failed": "failed"}[event]
    assert entry.status == status
    assert (reason is None) == (status == "paid")
    assert matcher.waiting() == 0
