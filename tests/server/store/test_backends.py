"""The store's operations behave the same on SQLite and PostgreSQL
(brmcp/server/store/: the shared SQL of ledger.py, journal.py and tips.py
run by each backend's executor): balances and audit rows, overdrafts and
the balance bound, refs applied once, callKeys claimed once, tips credited
once, held tips released once, interrupted calls refunded once; and a
random sequence of operations gives identical results on both."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp.server import store
from brmcp.server.calls import is_store_error
from brmcp.server.store import MAX_BALANCE_ATOMS, MAX_INT63, BalanceLimitError, HeldTip
from brmcp.server.store._executor import BatchExecutor
from tests.kit.postgres import PostgresServer

from .conftest import Backend, open_executor

PEER = "a" * 64
OTHER = "b" * 64


def credit(peer: str, atoms: int, ref: str, ts: float = 1.0) -> functools.partial[int]:
    return functools.partial(store.credit, peer=peer, atoms=atoms, ts=ts, kind="credit", ref=ref)


def charge(call_id: str, atoms: int, key: str | None = None, peer: str = PEER) -> functools.partial[Any]:
    return functools.partial(
        store.charge, call_id=call_id, peer=peer, call_key=key, tool="t", atoms=atoms, ts=2.0
    )


def tip(seq: int, matoms: int, *, allowed: bool = True, peer: str = PEER) -> functools.partial[Any]:
    return functools.partial(
        store.record_tip,
        sequence_id=seq,
        peer=peer,
        amount_matoms=matoms,
        atoms=matoms // 1000,
        credit_it=allowed,
        ts=3.0,
        local=True,
    )


def books(backend: Backend | BatchExecutor[Any]) -> tuple[dict[str, int], int]:
    """(balance per peer, sum of every movement's atoms)."""
    run = backend.run if isinstance(backend, Backend) else backend.run_now

    def read(c: Any) -> tuple[dict[str, int], int]:
        balances = {str(p): int(a) for p, a in c.execute("SELECT peer, atoms FROM balances").fetchall()}
        total = c.execute("SELECT COALESCE(SUM(atoms), 0) FROM movements").fetchone()[0]
        return balances, int(total)

    return run(read)


def test_credit_charge_statement_round_trip(store_backend: Backend) -> None:
    run = store_backend.run
    assert run(credit(PEER, 1000, "op:1")) == 1000
    assert run(charge("c1", 300, "k1")) == (True, 700)
    assert run(functools.partial(store.balance, peer=PEER)) == 700
    lines = run(functools.partial(store.statement, peer=PEER))
    assert [(e.kind, e.atoms, e.call_key, e.balance_after) for e in lines] == [
        ("credit", 1000, None, 1000),
        ("charge", -300, "k1", 700),
    ]
    assert isinstance(lines[0].ts, float)
    assert lines[1].ts == 2.0
    assert books(store_backend) == ({PEER: 700}, 700)


def test_overdraft_is_refused_and_writes_nothing(store_backend: Backend) -> None:
    run = store_backend.run
    run(credit(PEER, 10, "op:1"))
    assert run(charge("c1", 11)) == (False, 10)
    assert run(store.interrupted) == []
    assert books(store_backend) == ({PEER: 10}, 10)
    # A direct overdraft hits the CHECK constraint: the driver's integrity error, nothing written.
    with pytest.raises(Exception) as info:
        run(functools.partial(store.add_balance, peer=PEER, delta=-11))
    assert is_store_error(info.value)
    assert books(store_backend) == ({PEER: 10}, 10)


def test_balance_bound_and_64_bit_values(store_backend: Backend) -> None:
    run = store_backend.run
    assert run(credit(PEER, MAX_BALANCE_ATOMS, "op:max")) == MAX_BALANCE_ATOMS
    with pytest.raises(BalanceLimitError):
        run(credit(PEER, 1, "op:over"))
    assert books(store_backend) == ({PEER: MAX_BALANCE_ATOMS}, MAX_BALANCE_ATOMS)
    # The largest sequence id and amount a tip may carry round-trip exactly.
    assert run(tip(MAX_INT63, MAX_INT63, peer=OTHER)) == (True, 0)  # past the bound: seen, not credited
    assert run(
        functools.partial(store.tip_seen, sequence_id=MAX_INT63, peer=OTHER, amount_matoms=MAX_INT63)
    ) == ("done")


def test_a_ref_is_applied_once(store_backend: Backend) -> None:
    run = store_backend.run
    run(credit(PEER, 5, "op:same"))
    with pytest.raises(Exception) as info:
        run(credit(PEER, 5, "op:same"))
    assert is_store_error(info.value)
    assert books(store_backend) == ({PEER: 5}, 5)


def test_a_call_key_is_claimed_once(store_backend: Backend) -> None:
    run = store_backend.run
    run(credit(PEER, 100, "op:1"))
    assert run(charge("c1", 10, "key")) == (True, 90)
    with pytest.raises(Exception) as info:
        run(charge("c2", 10, "key"))  # the key is still charged: the unique index refuses
    assert is_store_error(info.value)
    assert books(store_backend) == ({PEER: 90}, 90)
    run(
        functools.partial(
            store.complete, call_id="c1", keyed=True, ts=5.0, expires=100.0, outcome_json='{"content":[]}'
        )
    )
    kept = run(functools.partial(store.completed_keyed, now=6.0))
    assert [(e.peer, e.call_key, e.atoms, e.expires, e.outcome) for e in kept] == [
        (PEER, "key", 10, 100.0, {"content": []})
    ]
    assert run(functools.partial(store.completed_keyed, now=100.0)) == []
    # Past its window the key may be charged again.
    assert run(charge("c3", 10, "key")) == (True, 80)


def test_a_failed_call_is_refunded_once(store_backend: Backend) -> None:
    run = store_backend.run
    run(credit(PEER, 100, "op:1"))
    run(charge("c1", 40, "k"))

    def outcome(balance: int | None) -> str:
        return f'{{"balance":{balance}}}'

    after = run(
        functools.partial(
            store.complete,
            call_id="c1",
            keyed=True,
            ts=5.0,
            expires=50.0,
            outcome_json=outcome,
            refund=(PEER, 40, True),
        )
    )
    assert after == 100
    assert run(functools.partial(store.completed_keyed, now=6.0))[0].outcome == {"balance": 100}
    kinds = [e.kind for e in run(functools.partial(store.statement, peer=PEER))]
    assert kinds == ["credit", "charge", "refund"]
    assert books(store_backend) == ({PEER: 100}, 100)


def test_tips_are_credited_once_and_held_tips_released_once(store_backend: Backend) -> None:
    run = store_backend.run
    assert run(tip(1, 5_999)) == (True, 5)
    assert run(tip(1, 5_999)) == (False, 0)
    assert run(tip(2, 999)) == (True, 0)  # under one atom: seen, nothing credited
    assert run(tip(3, 7_000, allowed=False)) == (True, 0)
    assert run(tip(3, 7_000, allowed=False)) == (False, 0)
    assert run(store.has_tips) is True
    assert run(store.held_peers) == [PEER]
    held = run(functools.partial(store.held_tips, peer=PEER))
    assert held == [HeldTip(3, PEER, 7_000, 7, 3.0)]
    release = functools.partial(store.release_held_tip, tip=held[0], ts=4.0, local=True)
    assert run(release) == 7
    assert run(release) == 0
    assert run(tip(3, 7_000)) == (False, 0)  # its audit row still proves it
    assert books(store_backend) == ({PEER: 12}, 12)


def test_interrupted_calls_are_refunded_once_even_by_two_recoverers(store_backend: Backend) -> None:
    run = store_backend.run
    run(credit(PEER, 100, "op:1"))
    run(charge("c1", 30, "k1"))
    run(charge("c2", 20))
    pending = run(store.interrupted)
    assert [(p[0], p[4], p[5]) for p in pending] == [("c1", 30, "charged"), ("c2", 20, "charged")]
    other = store_backend.reopen()
    try:
        for executor in (store_backend.executor, other):  # a second start-up finds them settled
            for call_id, peer, key, _tool, atoms, _state in pending:
                executor.run_now(
                    functools.partial(
                        store.recover_call,
                        call_id=call_id,
                        peer=peer,
                        call_key=key,
                        atoms=atoms,
                        ts=9.0,
                        expires=99.0,
                        outcome_json='{"isError":true}',
                        local=True,
                        charged=True,
                    )
                )
        assert books(other) == ({PEER: 100}, 100)
    finally:
        other.close()
    assert run(store.interrupted) == []
    assert [e.call_key for e in run(functools.partial(store.completed_keyed, now=10.0))] == ["k1"]


def test_external_billing_journal_and_pending_tips(store_backend: Backend) -> None:
    run = store_backend.run
    journal = functools.partial(
        store.journal_charge, call_id="c1", peer=PEER, call_key="k", tool="t", atoms=9, ts=1.0
    )
    run(functools.partial(journal, state="charging"))
    assert [p[5] for p in run(store.interrupted)] == ["charging"]
    run(functools.partial(journal, state="charged"))
    assert [p[5] for p in run(store.interrupted)] == ["charged"]
    new = functools.partial(
        store.record_tip,
        sequence_id=7,
        peer=PEER,
        amount_matoms=4_000,
        atoms=4,
        credit_it=True,
        ts=2.0,
        local=False,
    )
    assert run(new) == (True, 4)
    assert run(store.pending_tips) == [(7, PEER, 4_000, 4)]
    finish = functools.partial(store.finish_tip, sequence_id=7, peer=PEER, amount_matoms=4_000, ts=3.0)
    run(finish)
    run(finish)
    assert run(store.pending_tips) == []
    lines = run(functools.partial(store.statement, peer=PEER))
    assert [(e.kind, e.atoms, e.balance_after) for e in lines] == [("charge", -9, None), ("tip", 4, None)]
    assert run(functools.partial(store.gc_calls, now=10.0)) == 0


async def test_one_failing_operation_in_a_batch_rolls_back_only_itself(store_backend: Backend) -> None:
    ex = store_backend.executor
    await ex.run(credit(PEER, 50, "op:1"))
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        try:
            results[i] = await ex.run(charge(f"c{i}", 10, f"k{i % 5}"))
        except Exception as exc:
            results[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(one, i)
    charged = [i for i, r in results.items() if isinstance(r, tuple) and r[0]]
    assert len(charged) == 5  # one charge per key (and the balance covers exactly five)
    assert all(is_store_error(r) for r in results.values() if isinstance(r, Exception))
    assert books(store_backend) == ({PEER: 0}, 0)


# -- the same random operations on both backends ---------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("credit"), st.sampled_from([PEER, OTHER]), st.integers(1, 10**9), st.integers(0, 4)
        ),
        st.tuples(
            st.just("charge"), st.sampled_from([PEER, OTHER]), st.integers(1, 10**9), st.integers(0, 4)
        ),
        st.tuples(st.just("tip"), st.sampled_from([PEER, OTHER]), st.integers(0, 10**12), st.integers(0, 4)),
        st.tuples(st.just("complete"), st.sampled_from([PEER, OTHER]), st.integers(0, 1), st.integers(0, 9)),
    ),
    max_size=25,
)


def _apply(executor: BatchExecutor[Any], ops: list[tuple[str, str, int, int]]) -> list[Any]:
    out: list[Any] = []
    for n, (kind, peer, amount, small) in enumerate(ops):
        op: Any
        if kind == "credit":
            op = credit(peer, amount, f"op:{small}")
        elif kind == "charge":
            op = charge(f"c{n}", amount, None if small == 0 else f"k{small}", peer=peer)
        elif kind == "tip":
            op = tip(small, amount, allowed=small != 4, peer=peer)
        else:
            op = _complete_one(small, refund=amount == 1)
        try:
            out.append(executor.run_now(op))
        except BalanceLimitError:
            out.append("balance-limit")
        except Exception as exc:
            if not is_store_error(exc):
                raise
            out.append("store-error")
    out.append(executor.run_now(lambda c: store.statement(c, PEER) + store.statement(c, OTHER)))
    out.append(executor.run_now(store.interrupted))
    out.append(executor.run_now(lambda c: store.held_tips(c)))
    out.append(books(executor))
    return out


def _complete_one(index: int, *, refund: bool) -> Any:
    def op(c: Any) -> Any:
        pending = store.interrupted(c)
        if not pending:
            return None
        call_id, peer, key, _tool, atoms, _state = pending[index % len(pending)]
        return store.complete(
            c,
            call_id=call_id,
            keyed=key is not None,
            ts=7.0,
            expires=70.0,
            outcome_json="{}",
            refund=(peer, atoms, True) if refund else None,
        )

    return op


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_random_operations_agree_on_both_backends(
    postgres_server: PostgresServer, ops: list[tuple[str, str, int, int]]
) -> None:
    url = postgres_server.create_database("prop")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = []
            for name, store_url, data_dir in (("sqlite", "sqlite:", Path(tmp)), ("postgresql", url, None)):
                executor = open_executor(name, store_url, data_dir)
                try:
                    results.append(_apply(executor, ops))
                finally:
                    executor.close()
        assert results[0] == results[1]
        balances, total = results[1][-1]
        assert sum(balances.values()) == total  # every atom on a balance is audited
        assert all(v >= 0 for v in balances.values())
    finally:
        postgres_server.drop_database(url)
