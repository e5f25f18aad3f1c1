"""A paid call's COMMIT lost on the wire (PostgreSQL; brmcp/server/calls/_doubt.py).

A wrapper around the executor's psycopg connection makes one chosen
``COMMIT`` of a paid-call transaction (a charge or a completion, the
``READ COMMITTED`` ones) fail with ``OperationalError`` after the server
committed it, or before (the connection closed, the server rolling the
transaction back); optionally the server then stays unreachable for every
read the resolution makes. Whatever hypothesis picks: the caller's answer
matches what the book holds (charged only when the tool ran and its
result is the answer), a retry under the same callKey is answered at once
(never a wait on a claim nobody completes) with nothing charged twice,
and the books are exact to the atom.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mcp.types import CallToolResult

from brmcp import ManualClock
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.server.calls import (
    LEDGER_UNAVAILABLE_TEXT,
    OUTCOME_UNKNOWN_TEXT,
    RESOLVE_ATTEMPTS,
    UNKNOWN_REFUNDED_TEXT,
)
from brmcp.server.store.records import StoreError
from tests.kit import ALICE

PRICE = 500
CREDIT = 10_000
#: Seconds a same-callKey retry may take: a wait on a stale claim never ends
#: on the harness's manual timer, so it shows as this timeout.
PROMPT = 10.0


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


class WirePlan:
    """Which paid-call COMMIT to lose (``at``, counting from 0), whether the
    server had committed it, and whether every connection attempt after it
    fails (``down``: the server unreachable, until the test brings it back)."""

    def __init__(self, at: int, committed: bool, down: bool) -> None:
        self.at = at
        self.committed = committed
        self.down = down
        self.seen = 0
        self.fired = False


class DroppingConnection:
    """A psycopg connection whose ``COMMIT`` of the planned paid-call
    transaction is lost: run (or not) on the server, then the connection
    closes and ``OperationalError`` is raised, as when the wire drops."""

    def __init__(self, real: Any, plan: WirePlan) -> None:
        self._real = real
        self._plan = plan
        self._read_committed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        import psycopg

        if isinstance(query, str) and query.startswith("BEGIN"):
            self._read_committed = "READ COMMITTED" in query
        if isinstance(query, str) and query.endswith("COMMIT") and self._read_committed:
            plan = self._plan
            index, plan.seen = plan.seen, plan.seen + 1
            if index == plan.at:
                plan.fired = True
                if plan.committed:
                    self._real.execute(query, *args, **kwargs)
                self._real.close()
                raise psycopg.OperationalError("server closed the connection unexpectedly")
        return self._real.execute(query, *args, **kwargs)


def lose_a_commit(harness: Harness, plan: WirePlan, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Install ``plan`` on the harness's executor; returns the pauses the
    resolution asked for (seconds; none is slept)."""
    accounts = harness._accounts
    executor: Any = accounts.executor
    connect = executor._connect

    def reconnect() -> Any:
        if plan.fired and plan.down:
            raise StoreError("cannot connect to PostgreSQL store: server unreachable")
        return DroppingConnection(connect(), plan)

    monkeypatch.setattr(executor, "_connect", reconnect)
    executor._raw = DroppingConnection(executor._raw, plan)
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    accounts.resolve_pause = pause
    return pauses


def text_of(result: CallToolResult) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)


async def _run(
    url: str, calls: list[tuple[str, bool]], plan: WirePlan, monkeypatch: pytest.MonkeyPatch
) -> None:
    timer = ManualClock()
    harness = Harness(HarnessConfig(store=url, allowed_peers={ALICE}, calls_per_minute=10**6, timer=timer))
    executions: Counter[str | None] = Counter()

    @harness.tool(price_atoms=PRICE, description="Paid work")
    async def work(ctx: CallContext, fail: bool = False) -> dict[str, Any]:
        executions[ctx.call_key] += 1
        if fail:
            raise RuntimeError("asked to fail")
        return {"ok": True}

    spec = next(t for t in harness.tools() if t.name == "work")
    answers: dict[str, list[CallToolResult]] = {}
    async with harness:
        await harness.credit(ALICE, CREDIT)
        lose_a_commit(harness, plan, monkeypatch)
        for key, fail in calls:
            args = {"fail": fail}
            answers.setdefault(key, []).append(await harness.call(ALICE, spec, args, args, key))
        plan.down = False
        for key, fail in calls:
            args = {"fail": fail}
            with anyio.fail_after(PROMPT):
                retry = await harness.call(ALICE, spec, args, args, key)
            assert OUTCOME_UNKNOWN_TEXT not in text_of(retry), "the retry resolved from the journal"
            answers[key].append(retry)
    # A completion that could not be recorded leaves its call charged: the
    # next start settles it (refunded once), like a crash's.
    async with Harness(HarnessConfig(store=url, allowed_peers={ALICE}, timer=ManualClock())):
        pass
    assert rows(url, "SELECT call_id FROM calls WHERE state <> 'done'") == []

    # The books: per peer the balance is the sum of its movements and every
    # balance_after the running sum; no callKey charged or refunded twice.
    balances = {str(p): int(a) for p, a in rows(url, "SELECT peer, atoms FROM balances")}
    running: dict[str, int] = {}
    for peer, atoms, after in rows(url, "SELECT peer, atoms, balance_after FROM movements ORDER BY id"):
        running[peer] = running.get(peer, 0) + int(atoms)
        assert after == running[peer]
    assert running == balances
    kinds = Counter(
        (str(k), str(kind))
        for k, kind in rows(url, "SELECT call_key, kind FROM movements WHERE call_key IS NOT NULL")
    )
    net: Counter[str] = Counter()
    for key, atoms in rows(url, "SELECT call_key, atoms FROM movements WHERE call_key IS NOT NULL"):
        net[str(key)] += int(atoms)
    for key, fail in calls:
        assert kinds[(key, "charge")] <= 1, key
        assert net[key] in {0, -PRICE}, key
        assert executions[key] <= 1, key
        if net[key] == -PRICE:
            # Paid: the tool ran and succeeded, and the caller got its result.
            assert executions[key] == 1, key
            assert not fail, key
            assert any(not a.is_error for a in answers[key]), key
        ok = [a for a in answers[key] if not a.is_error]
        if ok:
            assert net[key] == -PRICE or plan.down, key
        for answer in answers[key]:
            said = text_of(answer)
            if LEDGER_UNAVAILABLE_TEXT in said or UNKNOWN_REFUNDED_TEXT in said:
                assert not answer.meta or "brmcp/chargedAtoms" not in answer.meta
    assert balances[ALICE] == CREDIT + sum(net.values())


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["k-a", "k-b", "k-c"]), st.booleans()), min_size=1, max_size=3
    ).map(lambda c: list(dict(c).items())),
    at=st.integers(0, 5),
    committed=st.booleans(),
    unreachable=st.booleans(),
)
# A completion whose COMMIT never landed, with the book then unreachable: the
# result is withheld (a next start refunds the charge) and kept for the same
# callKey's retry, which journals it first.
@example(calls=[("k-a", False)], at=1, committed=False, unreachable=True)
@example(calls=[("k-a", False), ("k-b", False)], at=1, committed=True, unreachable=True)
def test_a_lost_commit_is_resolved_from_the_book(
    postgres_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    calls: list[tuple[str, bool]],
    at: int,
    committed: bool,
    unreachable: bool,
) -> None:
    url = postgres_server.create_database()
    try:
        plan = WirePlan(at, committed, unreachable)
        anyio.run(_run, url, calls, plan, monkeypatch)
    finally:
        postgres_server.drop_database(url)


async def _first_charge(url: str, committed: bool, down: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    timer = ManualClock()
    harness = Harness(HarnessConfig(store=url, allowed_peers={ALICE}, calls_per_minute=10**6, timer=timer))
    runs: list[str | None] = []

    @harness.tool(price_atoms=PRICE, description="Paid work")
    async def work(ctx: CallContext) -> dict[str, Any]:
        runs.append(ctx.call_key)
        return {"ok": True}

    spec = next(t for t in harness.tools() if t.name == "work")
    async with harness:
        await harness.credit(ALICE, CREDIT)
        plan = WirePlan(0, committed, down)
        pauses = lose_a_commit(harness, plan, monkeypatch)
        first = await harness.call(ALICE, spec, {}, {}, "k-1")
        plan.down = False
        with anyio.fail_after(PROMPT):
            retry = await harness.call(ALICE, spec, {}, {}, "k-1")
        balance = await harness.balance(ALICE)
    if down:
        assert OUTCOME_UNKNOWN_TEXT in text_of(first)
        assert len(pauses) == RESOLVE_ATTEMPTS - 1
        if committed:
            # Settled before the retry: refunded once, the key answers why.
            assert UNKNOWN_REFUNDED_TEXT in text_of(retry)
            assert runs == []
            assert balance == CREDIT
        else:
            assert not retry.is_error
            assert runs == ["k-1"]
            assert balance == CREDIT - PRICE
    elif committed:
        # Found recorded: the call ran as charged; the retry replays it.
        assert not first.is_error
        assert runs == ["k-1"]
        assert retry.model_dump() == first.model_dump()
        assert balance == CREDIT - PRICE
    else:
        assert LEDGER_UNAVAILABLE_TEXT in text_of(first)
        assert not retry.is_error
        assert runs == ["k-1"]
        assert balance == CREDIT - PRICE


@pytest.mark.parametrize(("committed", "down"), [(True, False), (False, False), (True, True), (False, True)])
def test_a_lost_charge_commit_answers_what_the_book_holds(
    postgres_server: Any, monkeypatch: pytest.MonkeyPatch, committed: bool, down: bool
) -> None:
    url = postgres_server.create_database()
    try:
        anyio.run(_first_charge, url, committed, down, monkeypatch)
    finally:
        postgres_server.drop_database(url)


async def _unkeyed_completion(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    harness = Harness(
        HarnessConfig(store=url, allowed_peers={ALICE}, calls_per_minute=10**6, timer=ManualClock())
    )
    runs: list[str | None] = []

    @harness.tool(price_atoms=PRICE, description="Paid work")
    async def work(ctx: CallContext) -> dict[str, Any]:
        runs.append(ctx.call_key)
        return {"ok": True}

    spec = next(t for t in harness.tools() if t.name == "work")
    async with harness:
        await harness.credit(ALICE, CREDIT)
        # The charge commits; the completion's COMMIT never lands and the
        # server stays out of reach.
        plan = WirePlan(1, False, True)
        lose_a_commit(harness, plan, monkeypatch)
        answer = await harness.call(ALICE, spec, {}, {}, None)
        plan.down = False  # the server is back before this process stops
    assert runs == [None]
    assert answer.is_error
    assert "not delivered" in text_of(answer)
    assert f"the {PRICE} atoms charged are refunded when the bot next starts" in text_of(answer)
    assert not answer.meta or "brmcp/chargedAtoms" not in answer.meta
    # The next start refunds it, once: the caller paid nothing for a result it never got.
    for _ in range(2):
        async with Harness(HarnessConfig(store=url, allowed_peers={ALICE}, timer=ManualClock())) as again:
            assert await again.balance(ALICE) == CREDIT
    assert rows(url, "SELECT state FROM calls WHERE state <> 'done'") == []
    moves = rows(url, "SELECT kind, atoms FROM movements ORDER BY id")
    assert moves == [("credit", CREDIT), ("charge", -PRICE), ("recovery_refund", PRICE)]


def test_an_unkeyed_result_whose_completion_is_lost_is_not_delivered(
    postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = postgres_server.create_database()
    try:
        anyio.run(_unkeyed_completion, url, monkeypatch)
    finally:
        postgres_server.drop_database(url)
