"""The daemon's TipPayer says once, at INFO, what a tip outstanding for more
than TIP_SLOW_SECS waits for (brmcp/bridge/daemon/_daemon.py): brclient taking it
(TipUser blocks for brclient's tip restart delay after each start) or its
outcome. Driven by a manual clock and a stand-in clientrpc client, so no
real time passes."""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import pytest

from brmcp.bridge import ManualClock, TipMatcher, TipPayer
from brmcp.clientrpc.tippayer import TIP_MAX_ATTEMPTS, TIP_SLOW_SECS, TipStalledError
from tests.kit.bridge import until

PAYEE = "ab" * 32
LOGGER = "brmcp.bridge.daemon._daemon"


class _Client:
    """Stands in for :class:`brmcp.clientrpc.Client`: always connected;
    ``tip_user`` records the call and, while ``hold`` is set, blocks until
    it is set (brclient's TipUser during its restart delay)."""

    connected = True

    def __init__(self, hold: bool = False) -> None:
        self.tips: list[tuple[str, float, int]] = []
        self.hold = anyio.Event() if hold else None

    async def wait_connected(self) -> None:
        return None

    async def tip_user(self, uid_hex: str, dcr_amount: float, max_attempts: int) -> None:
        self.tips.append((uid_hex, dcr_amount, max_attempts))
        if self.hold is not None:
            await self.hold.wait()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and "tip of" in r.getMessage()]


async def _settled() -> None:
    """Let the tasks woken by the clock run."""
    for _ in range(5):
        await anyio.lowlevel.checkpoint()


def _payer(client: _Client, clock: ManualClock) -> tuple[TipPayer, TipMatcher]:
    matcher = TipMatcher()
    return TipPayer(client, matcher, clock=clock), matcher  # type: ignore[arg-type]


async def test_a_tip_brclient_has_not_taken_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = ManualClock()
    client = _Client(hold=True)
    payer, matcher = _payer(client, clock)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(payer.pay, PAYEE, 500)
            await until(lambda: bool(client.tips) and clock.sleepers > 0)
            clock.advance(TIP_SLOW_SECS - 0.5)
            await _settled()
            assert _lines(caplog) == []
            clock.advance(0.5)
            await until(lambda: bool(_lines(caplog)))
            # Once, however long it takes.
            for _ in range(12):
                clock.advance(TIP_SLOW_SECS)
                await _settled()
            (line,) = _lines(caplog)
            assert line.startswith(
                f"tip of 500 atoms to bot {PAYEE}: waiting for brclient to take it (5s so far)"
            )
            assert (
                "[tipuser] restartdelay in brclient.conf, brnet's -tiprestartdelay; 1m0s by default" in line
            )
            assert client.hold is not None
            client.hold.set()
            await until(lambda: matcher.waiting() > 0 and bool(client.tips))
            assert matcher.resolve(PAYEE, 500_000, None)
    assert len(_lines(caplog)) == 1
    assert clock.sleepers == 0  # the note's task ended with the payment


async def test_a_tip_waiting_for_its_outcome_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = ManualClock()
    client = _Client()
    payer, matcher = _payer(client, clock)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(payer.pay, PAYEE.upper(), 700)
            await until(lambda: bool(client.tips) and clock.sleepers > 0)
            clock.advance(TIP_SLOW_SECS)
            await until(lambda: bool(_lines(caplog)))
            clock.advance(60)
            await _settled()
            (line,) = _lines(caplog)
            assert line.startswith(
                f"tip of 700 atoms to bot {PAYEE}: waiting for brclient to complete it"
                f" (attempt 1 of {TIP_MAX_ATTEMPTS}, 5s so far)"
            )
            assert "[tipuser] rerequestinvoicedelay (24h0m0s by default)" in line
            assert matcher.resolve(PAYEE, 700_000, None)
    assert client.tips == [(PAYEE, 7e-06, TIP_MAX_ATTEMPTS)]


async def test_a_quick_tip_logs_nothing_and_failures_keep_their_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = ManualClock()
    client = _Client()
    payer, matcher = _payer(client, clock)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(payer.pay, PAYEE, 100)
            await until(lambda: matcher.waiting() > 0 and bool(client.tips))
            assert matcher.resolve(PAYEE, 100_000, None)
        assert clock.sleepers == 0
        clock.advance(10 * TIP_SLOW_SECS)
        await _settled()
        assert _lines(caplog) == []

        # A stalled attempt still raises TipStalledError itself (no group).
        async def stall_soon() -> None:
            await until(lambda: matcher.waiting() > 0 and len(client.tips) == 2)
            assert matcher.stall(PAYEE, 100_000, "no route to the payee")

        async with anyio.create_task_group() as tg:
            tg.start_soon(stall_soon)
            with pytest.raises(TipStalledError, match="tip cannot complete now: no route to the payee"):
                await payer.pay(PAYEE, 100)
    assert _lines(caplog) == []
