"""The paid-call path on a shared PostgreSQL book
(brmcp/server/store/postgres/paidcalls.py), run ``READ COMMITTED`` by the
executor: two processes charging different callers in transactions open
at the same time are never rolled back; two charging one balance at once
serialise on its row and never overdraw it; two claiming one callKey at
once charge it once; a completion after a sibling's recovery refunds
nothing."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from brmcp.server import store
from brmcp.server.store.journal import KeyHolder
from brmcp.server.store.postgres import PostgresExecutor, paidcalls
from brmcp.server.store.postgres.connection import RowLocked
from brmcp.server.store.url import parse_store_url

PEERS = [f"{n:x}" * 64 for n in range(1, 9)]


def executor(url: str) -> PostgresExecutor:
    return PostgresExecutor(parse_store_url(url))


def credit(ex: PostgresExecutor, peer: str, atoms: int) -> None:
    ex.run_now(
        functools.partial(store.credit, peer=peer, atoms=atoms, ts=1.0, kind="credit", ref=f"c-{peer}")
    )


def charge_op(call_id: str, peer: str, call_key: str | None, atoms: int = 30) -> Callable[[Any], Any]:
    return functools.partial(
        paidcalls.charge,
        call_id=call_id,
        peer=peer,
        call_key=call_key,
        tool="t",
        atoms=atoms,
        ts=2.0,
        owner="o",
    )


class LockWatch:
    """Whether a backend of the database waits for a lock now, asked on one
    connection of its own (quick enough to answer well inside the
    executor's lock timeout)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    def waiting(self) -> bool:
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()
        return row is not None and int(row[0]) > 0

    def close(self) -> None:
        self.conn.close()


def held_open_until(
    ready: Callable[[], bool], op: Callable[[Any], Any], limit: int = 2000
) -> Callable[[Any], Any]:
    """``op``, then hold its transaction open until ``ready()`` (polled,
    at most ``limit`` times)."""

    def run(conn: Any) -> Any:
        result = op(conn)
        for _ in range(limit):
            if ready():
                break
        return result

    return run


def test_disjoint_callers_charged_in_transactions_open_together_are_never_rolled_back(
    postgres_url: str,
) -> None:
    first, second = executor(postgres_url), executor(postgres_url)
    try:
        for peer in PEERS:
            credit(first, peer, 100)
        both = threading.Barrier(2)

        def batch(name: str, peers: list[str]) -> Callable[[Any], Any]:
            def op(conn: Any) -> list[Any]:
                out = [charge_op(f"{name}-{n}", peer, f"k-{name}-{n}")(conn) for n, peer in enumerate(peers)]
                both.wait(10)  # both transactions have read and written before either commits
                out += [
                    paidcalls.complete(
                        conn, call_id=f"{name}-{n}", keyed=True, ts=3.0, expires=9.0, outcome_json="{}"
                    )
                    for n in range(len(peers))
                ]
                return out

            return op

        results: dict[str, Any] = {}
        threads = [
            threading.Thread(
                target=lambda ex=ex, n=n, p=p: results.__setitem__(n, ex.run_now(RowLocked(batch(n, p))))
            )
            for ex, n, p in ((first, "a", PEERS[:4]), (second, "b", PEERS[4:]))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert first.retries == second.retries == 0
        assert results["a"] == results["b"] == [(True, 70)] * 4 + [None] * 4
        for peer in PEERS:
            assert first.run_now(functools.partial(store.balance, peer=peer)) == 70
    finally:
        first.close()
        second.close()


def test_one_balance_charged_by_two_processes_at_once_is_never_overdrawn(postgres_url: str) -> None:
    first, second = executor(postgres_url), executor(postgres_url)
    peer = PEERS[0]
    watch = LockWatch(postgres_url)
    try:
        credit(first, peer, 50)
        charged_first = threading.Event()
        results: dict[str, Any] = {}
        holder = threading.Thread(
            target=lambda: results.__setitem__(
                "first",
                first.run_now(
                    RowLocked(
                        held_open_until(
                            lambda: charged_first.set() or watch.waiting(), charge_op("c1", peer, None)
                        )
                    )
                ),
            )
        )
        holder.start()
        assert charged_first.wait(10)
        results["second"] = second.run_now(RowLocked(charge_op("c2", peer, None)))
        holder.join(30)
        assert results == {"first": (True, 20), "second": (False, 20)}
        assert first.retries == second.retries == 0
        lines = first.run_now(functools.partial(store.statement, peer=peer))
        assert [(e.kind, e.atoms, e.balance_after) for e in lines] == [
            ("credit", 50, 50),
            ("charge", -30, 20),
        ]
    finally:
        watch.close()
        first.close()
        second.close()


def test_one_callkey_claimed_by_two_processes_at_once_is_charged_once(postgres_url: str) -> None:
    first, second = executor(postgres_url), executor(postgres_url)
    peer = PEERS[0]
    watch = LockWatch(postgres_url)
    try:
        credit(first, peer, 100)
        claimed_first = threading.Event()
        results: dict[str, Any] = {}
        holder = threading.Thread(
            target=lambda: results.__setitem__(
                "first",
                first.run_now(
                    RowLocked(
                        held_open_until(
                            lambda: claimed_first.set() or watch.waiting(), charge_op("c1", peer, "k")
                        )
                    )
                ),
            )
        )
        holder.start()
        assert claimed_first.wait(10)
        results["second"] = second.run_now(RowLocked(charge_op("c2", peer, "k")))
        holder.join(30)
        assert results == {"first": (True, 70), "second": KeyHolder("running", None, None)}
        assert first.run_now(functools.partial(store.balance, peer=peer)) == 70
        done = RowLocked(
            functools.partial(
                paidcalls.complete, call_id="c1", keyed=True, ts=3.0, expires=9.0, outcome_json='{"ok": 1}'
            )
        )
        assert first.run_now(done) is None
        assert second.run_now(RowLocked(charge_op("c3", peer, "k"))) == KeyHolder("done", '{"ok": 1}', 9.0)
        # Past its replay window the key is free again, and charged again once.
        late = functools.partial(
            paidcalls.charge, call_id="c4", peer=peer, call_key="k", tool="t", atoms=30, ts=10.0, owner="o"
        )
        assert second.run_now(RowLocked(late)) == (True, 40)
    finally:
        watch.close()
        first.close()
        second.close()


def test_a_completion_after_a_siblings_recovery_refunds_nothing(postgres_url: str) -> None:
    ex = executor(postgres_url)
    peer = PEERS[0]
    try:
        credit(ex, peer, 100)
        assert ex.run_now(RowLocked(charge_op("c1", peer, "k"))) == (True, 70)
        ex.run_now(
            functools.partial(
                store.recover_call,
                call_id="c1",
                peer=peer,
                call_key="k",
                atoms=30,
                ts=3.0,
                expires=9.0,
                outcome_json="{}",
                local=True,
                charged=True,
            )
        )
        complete = functools.partial(
            paidcalls.complete,
            call_id="c1",
            keyed=True,
            ts=4.0,
            expires=9.0,
            outcome_json=lambda balance: "{}",
            refund=(peer, 30, True),
        )
        assert ex.run_now(RowLocked(complete)) is None
        lines = ex.run_now(functools.partial(store.statement, peer=peer))
        assert [(e.kind, e.atoms, e.balance_after) for e in lines] == [
            ("credit", 100, 100),
            ("charge", -30, 70),
            ("recovery_refund", 30, 100),
        ]
    finally:
        ex.close()
