"""Interleavings of the paid-call path on a shared PostgreSQL book
(brmcp/server/store/postgres/paidcalls.py), forced statement by statement.

Each :class:`Session` is one backend (its own connection, as a pool member
has) running a real store function on a worker thread inside a
transaction of its own isolation; it can stop just before a chosen
statement, or after the function returned with its transaction still open,
so a test decides which transaction holds which row lock when another one
runs into it. A blocked statement is seen in ``pg_stat_activity``
(``wait_event_type = 'Lock'``), never guessed from elapsed time. After each
interleaving the books are checked: every balance equals the sum of its
audit rows, every audit row's running balance is exact, and no call is
charged or refunded twice.

Covered: the claim-then-debit statement waiting on another transaction's
debit of the balance or its uncommitted claim of the key (committed or
rolled back), an expired record replaced by two charges at once, a tip
and a debit of one balance, a late completion against a sibling's
recovery in every lock order (including their deadlock), several paid-call
operations of one executor batch (one failing, one key twice, a lock wait
rolling the batch back), and a property test over random statement-level
interleavings of all of these.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp.server import store
from brmcp.server.store._executor import Slot
from brmcp.server.store.journal import KeyHolder
from brmcp.server.store.postgres import PostgresExecutor, paidcalls
from brmcp.server.store.postgres.connection import PgConnection, RowLocked, is_retryable
from brmcp.server.store.url import parse_store_url

PEER = "a" * 64
OTHER = "b" * 64
#: Polls of ``pg_stat_activity`` before a wait that should happen is failed.
POLLS = 20_000
#: Seconds a worker thread may take to reach its next stop.
STEP = 10.0
#: ``pause_before`` value stopping a :class:`Session` before every statement.
STEP_ALL = "\x00every statement"


class Session:
    """One transaction of ``isolation`` on its own connection to ``url``,
    run on a worker thread. :meth:`start` runs ``op(conn)`` inside it,
    stopping before the first statement containing ``pause_before`` (when
    given; ``STEP_ALL``: before every statement) until :meth:`resume`; once
    ``op`` returned (or raised) the transaction stays open until
    :meth:`commit` or :meth:`rollback`. Each stop puts an event
    (``"paused"``, ``"returned"``, ``"ended"``) on :attr:`events`."""

    def __init__(self, url: str, isolation: str) -> None:
        import psycopg

        self.raw = psycopg.connect(url, autocommit=True)
        self.raw.execute("SET lock_timeout = '20s'")
        # A deadlock among the sessions is broken quickly (superuser setting).
        self.raw.execute("SET deadlock_timeout = '50ms'")
        self.pid = int(self.raw.info.backend_pid)
        self.isolation = isolation
        self.events: queue.Queue[str] = queue.Queue()
        self._commands: queue.Queue[str] = queue.Queue()
        self._pause: str | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, op: Callable[[Any], Any], pause_before: str | None = None) -> None:
        self._pause = pause_before
        self._thread = threading.Thread(target=self._body, args=(op,), daemon=True)
        self._thread.start()

    def _body(self, op: Callable[[Any], Any]) -> None:
        session = self

        class Gated(PgConnection):
            __slots__ = ()

            def execute(self, sql: str, parameters: Any = (), /) -> Any:
                if session._pause is STEP_ALL:
                    session.events.put("paused")
                    assert session._commands.get(timeout=STEP * 3) == "resume"
                elif session._pause is not None and session._pause in sql:
                    session._pause = None
                    session.events.put("paused")
                    assert session._commands.get(timeout=STEP) == "resume"
                return super().execute(sql, parameters)

        self.raw.execute(f"BEGIN ISOLATION LEVEL {self.isolation}")
        try:
            self.result = op(Gated(self.raw))
        except BaseException as exc:
            self.error = exc
        self.events.put("returned")
        command = self._commands.get(timeout=STEP * 3)
        self.raw.execute("ROLLBACK" if command == "rollback" or self.error is not None else "COMMIT")
        self.events.put("ended")

    def wait(self, event: str) -> None:
        got = self.events.get(timeout=STEP)
        assert got == event, (got, event, self.error)

    def resume(self) -> None:
        self._commands.put("resume")

    def end(self) -> None:
        """Commit once ``op`` returned (roll back when it raised), without waiting."""
        self._commands.put("commit")

    def commit(self) -> Any:
        self._commands.put("commit")
        self.wait("ended")
        if self.error is not None:
            raise self.error
        return self.result

    def rollback(self) -> None:
        self._commands.put("rollback")
        self.wait("ended")

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._commands.put("rollback")
            self._thread.join(STEP)
        self.raw.close()


class Book:
    """The database of one test: sessions on it, a watcher connection,
    and the checks of its books."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self.executor = PostgresExecutor(parse_store_url(url))
        self.watch = psycopg.connect(url, autocommit=True)
        self.sessions: list[Session] = []

    def session(self, isolation: str = "READ COMMITTED") -> Session:
        s = Session(self.url, isolation)
        self.sessions.append(s)
        return s

    def waits(self, s: Session) -> bool:
        """Whether ``s``'s backend waits for a lock now."""
        row = self.watch.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (s.pid,)
        ).fetchone()
        return row is not None and row[0] == "Lock"

    def blocked(self, s: Session) -> None:
        """Return once ``s``'s backend waits for a lock (failing after :data:`POLLS` polls)."""
        for _ in range(POLLS):
            if self.waits(s):
                return
        pytest.fail("the session never waited for a lock")

    def run(self, op: Callable[[Any], Any]) -> Any:
        return self.executor.run_now(op)

    def credit(self, peer: str, atoms: int, ref: str = "c") -> None:
        self.run(
            functools.partial(
                store.credit, peer=peer, atoms=atoms, ts=1.0, kind="credit", ref=f"{ref}-{peer}"
            )
        )

    def balance(self, peer: str) -> int:
        return int(self.run(functools.partial(store.balance, peer=peer)))

    def check(self) -> None:
        """The books are exact: each balance is the sum of its audit rows,
        each audit row's ``balance_after`` the running sum, no call has two
        charges or two refunds, and every call in flight or settled with a
        key has exactly one charge."""
        rows = self.watch.execute(
            "SELECT peer, kind, atoms, balance_after, ref FROM movements ORDER BY id"
        ).fetchall()
        running: dict[str, int] = {}
        for peer, _kind, atoms, after, _ref in rows:
            running[peer] = running.get(peer, 0) + int(atoms)
            if after is not None:
                assert int(after) == running[peer], rows
        balances = {str(p): int(a) for p, a in self.watch.execute("SELECT peer, atoms FROM balances")}
        assert balances == running
        refs = [str(r[4]) for r in rows]
        call_ids = [ref.split(":", 1)[1] for ref in refs if ref.startswith("charge:")]
        refunded = [ref.split(":", 1)[1] for ref in refs if ref.startswith("refund:")]
        assert set(refunded) <= set(call_ids)
        for call_id, state in self.watch.execute("SELECT call_id, state FROM calls").fetchall():
            if state != "done":
                assert call_id in call_ids
                assert call_id not in refunded

    def close(self) -> None:
        for s in self.sessions:
            s.close()
        self.watch.close()
        self.executor.close()


@pytest.fixture
def book(postgres_url: str) -> Iterator[Book]:
    b = Book(postgres_url)
    try:
        yield b
    finally:
        b.close()


def charge(
    call_id: str,
    call_key: str | None,
    *,
    peer: str = PEER,
    atoms: int = 30,
    ts: float = 2.0,
    gc: bool = False,
) -> Any:
    return functools.partial(
        paidcalls.charge,
        call_id=call_id,
        peer=peer,
        call_key=call_key,
        tool="t",
        atoms=atoms,
        ts=ts,
        owner="o",
        gc=gc,
    )


def complete(call_id: str, *, refund: bool, peer: str = PEER, atoms: int = 30, keyed: bool = True) -> Any:
    return functools.partial(
        paidcalls.complete,
        call_id=call_id,
        keyed=keyed,
        ts=3.0,
        expires=9.0,
        outcome_json=lambda balance: f'{{"balance": {balance}}}',
        refund=(peer, atoms, True) if refund else None,
    )


def recover(call_id: str, call_key: str | None = "k", *, peer: str = PEER, atoms: int = 30) -> Any:
    return functools.partial(
        store.recover_call,
        call_id=call_id,
        peer=peer,
        call_key=call_key,
        atoms=atoms,
        ts=4.0,
        expires=9.0,
        outcome_json='{"interrupted": true}',
        local=True,
        charged=True,
    )


def tip(seq: int, atoms: int, *, peer: str = PEER) -> Any:
    return functools.partial(
        store.record_tip,
        sequence_id=seq,
        peer=peer,
        amount_matoms=atoms * 1000,
        atoms=atoms,
        credit_it=True,
        ts=2.5,
        local=True,
    )


# -- the charge: claim and debit in one statement ------------------------------------------


def test_a_charge_waiting_on_anothers_debit_of_the_balance_debits_the_balance_it_left(book: Book) -> None:
    """The debit's row-lock wait and re-check (EvalPlanQual) inside the
    claim-then-debit statement: the second charge sees the first's debit."""
    book.credit(PEER, 100)
    first, second = book.session(), book.session()
    first.start(charge("c1", "k1"))
    first.wait("returned")
    second.start(charge("c2", "k2"))
    book.blocked(second)
    assert first.commit() == (True, 70)
    second.wait("returned")
    assert second.commit() == (True, 40)
    assert book.balance(PEER) == 40
    book.check()


def test_a_charge_waiting_on_anothers_debit_refuses_what_the_balance_no_longer_covers(book: Book) -> None:
    book.credit(PEER, 50)
    first, second = book.session(), book.session()
    first.start(charge("c1", "k1"))
    first.wait("returned")
    second.start(charge("c2", "k2"))
    book.blocked(second)
    assert first.commit() == (True, 20)
    second.wait("returned")
    assert second.commit() == (False, 20)
    assert book.run(lambda c: c.execute("SELECT call_id FROM calls ORDER BY call_id").fetchall()) == [("c1",)]
    book.check()


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_claim_waiting_on_anothers_uncommitted_claim_of_the_key_charges_once(
    book: Book, outcome: str
) -> None:
    """The claim's INSERT ... ON CONFLICT waits on the other transaction's
    uncommitted insert of the same (peer, callKey): answered as held when
    it committed, claimed and charged when it rolled back."""
    book.credit(PEER, 100)
    first, second = book.session(), book.session()
    first.start(charge("c1", "k"))
    first.wait("returned")
    second.start(charge("c2", "k"))
    book.blocked(second)
    if outcome == "commit":
        assert first.commit() == (True, 70)
        second.wait("returned")
        assert second.commit() == KeyHolder("running", None, None)
    else:
        first.rollback()
        second.wait("returned")
        assert second.commit() == (True, 70)
    assert book.balance(PEER) == 70
    book.check()


def test_a_claim_waiting_while_the_balance_is_credited_and_debited_meanwhile_stays_exact(book: Book) -> None:
    """The claim waits on another transaction's claim of the key (one the
    balance did not cover: its row is deleted again before it commits)
    while others commit a debit and a credit of the balance: the waiter's
    debit, judged on the balance as committed after the wait, is exact."""
    book.credit(PEER, 40)
    holder, waiter = book.session(), book.session()
    holder.start(charge("c1", "k", atoms=1000))
    holder.wait("returned")
    assert holder.result == (False, 40)
    waiter.start(charge("c2", "k"))
    book.blocked(waiter)
    # Committed while the waiter's statement (and its snapshot) is open.
    assert book.run(RowLocked(charge("c3", "k3", atoms=10))) == (True, 30)
    book.credit(PEER, 25, ref="late")
    assert holder.commit() == (False, 40)
    waiter.wait("returned")
    assert waiter.commit() == (True, 25)
    assert book.balance(PEER) == 25
    book.check()


def test_an_expired_key_replaced_by_two_charges_at_once_is_charged_once(book: Book) -> None:
    """An expired completed row of the key: one charge deletes it and claims
    the key; the other, waiting on that, is answered as held."""
    book.credit(PEER, 100)
    assert book.run(RowLocked(charge("c0", "k", ts=1.0))) == (True, 70)
    assert book.run(RowLocked(complete("c0", refund=False))) is None  # expires at 9.0
    first, second = book.session(), book.session()
    first.start(charge("c1", "k", ts=10.0))
    first.wait("returned")
    second.start(charge("c2", "k", ts=10.0))
    book.blocked(second)
    assert first.commit() == (True, 40)
    second.wait("returned")
    assert second.commit() == KeyHolder("running", None, None)
    book.check()


def test_an_expired_key_whose_replacement_rolled_back_is_claimed_by_the_waiter(book: Book) -> None:
    book.credit(PEER, 100)
    assert book.run(RowLocked(charge("c0", "k", ts=1.0))) == (True, 70)
    assert book.run(RowLocked(complete("c0", refund=False))) is None
    first, second = book.session(), book.session()
    first.start(charge("c1", "k", ts=10.0))
    first.wait("returned")
    second.start(charge("c2", "k", ts=10.0))
    book.blocked(second)
    first.rollback()
    second.wait("returned")
    assert second.commit() == (True, 40)
    book.check()


def test_a_duplicate_between_the_claim_and_the_read_of_its_holder_sees_the_winner(book: Book) -> None:
    """The claim found the key taken; before it reads the holder the holder
    completes: the answer is the completed outcome, nothing charged."""
    book.credit(PEER, 100)
    assert book.run(RowLocked(charge("c1", "k"))) == (True, 70)
    dup = book.session()
    dup.start(charge("c2", "k"), pause_before="SELECT state, expires")
    dup.wait("paused")
    assert book.run(RowLocked(complete("c1", refund=False))) is None
    dup.resume()
    dup.wait("returned")
    assert dup.commit() == KeyHolder("done", '{"balance": None}', 9.0)
    book.check()


def test_a_tip_and_a_debit_of_one_balance_at_once_both_land(book: Book) -> None:
    """A SERIALIZABLE tip credit and a READ COMMITTED debit on one balance,
    each waiting on the other's row lock in turn: the tip that read the
    balance before the debit committed is rolled back (40001), never lost
    silently nor applied over the debit."""
    book.credit(PEER, 100)
    debit, credit_ = book.session(), book.session("SERIALIZABLE")
    credit_.start(tip(1, 5), pause_before="INSERT INTO balances")
    credit_.wait("paused")  # the tip has read the balance (100)
    debit.start(charge("c1", "k"))
    debit.wait("returned")
    credit_.resume()
    book.blocked(credit_)
    assert debit.commit() == (True, 70)
    credit_.wait("returned")
    assert credit_.error is not None
    assert is_retryable(credit_.error)
    credit_.rollback()
    assert book.run(tip(1, 5)) == (True, 5)
    assert book.balance(PEER) == 75
    book.check()


# -- the completion against a sibling's recovery ---------------------------------------------


def charged_call(book: Book, call_key: str | None = "k") -> None:
    book.credit(PEER, 100)
    assert book.run(RowLocked(charge("c1", call_key))) == (True, 70)


def refunds(book: Book) -> list[tuple[str, int]]:
    return [
        (str(kind), int(atoms))
        for kind, atoms in book.watch.execute(
            "SELECT kind, atoms FROM movements WHERE kind LIKE '%refund' ORDER BY id"
        ).fetchall()
    ]


def settled(book: Book, call_id: str = "c1") -> tuple[str, str | None] | None:
    row = book.watch.execute("SELECT state, outcome FROM calls WHERE call_id = %s", (call_id,)).fetchone()
    return None if row is None else (str(row[0]), row[1])


@pytest.mark.parametrize("refund", [True, False])
def test_a_completion_committed_under_a_recovery_in_progress_rolls_the_recovery_back(
    book: Book, refund: bool
) -> None:
    """The recovery (SERIALIZABLE) read the call as in flight; the owner's
    late completion commits before the recovery writes: the recovery fails
    with a serialization failure and, run again, changes nothing."""
    charged_call(book)
    recovery = book.session("SERIALIZABLE")
    recovery.start(recover("c1"), pause_before="INSERT INTO balances")
    recovery.wait("paused")
    expected = 100 if refund else None
    assert book.run(RowLocked(complete("c1", refund=refund))) == expected
    recovery.resume()
    recovery.wait("returned")
    assert recovery.error is not None
    assert is_retryable(recovery.error)
    recovery.rollback()
    book.run(recover("c1"))
    assert refunds(book) == ([("refund", 30)] if refund else [])
    assert settled(book) == ("done", f'{{"balance": {expected}}}')
    book.check()


def test_a_completion_waiting_on_a_recovery_refunds_nothing_once_it_committed(book: Book) -> None:
    charged_call(book)
    recovery, late = book.session("SERIALIZABLE"), book.session()
    recovery.start(recover("c1"))
    recovery.wait("returned")
    late.start(complete("c1", refund=True))
    book.blocked(late)
    assert recovery.commit() is None
    late.wait("returned")
    assert late.commit() is None
    assert refunds(book) == [("recovery_refund", 30)]
    assert settled(book) == ("done", '{"interrupted": true}')
    book.check()


def test_a_recovery_waiting_on_a_completion_is_rolled_back_once_it_committed(book: Book) -> None:
    charged_call(book)
    late, recovery = book.session(), book.session("SERIALIZABLE")
    late.start(complete("c1", refund=True))
    late.wait("returned")
    recovery.start(recover("c1"))
    book.blocked(recovery)
    assert late.commit() == 100
    recovery.wait("returned")
    assert recovery.error is not None
    assert is_retryable(recovery.error)
    recovery.rollback()
    book.run(recover("c1"))
    assert refunds(book) == [("refund", 30)]
    book.check()


@pytest.mark.parametrize("call_key", ["k", None])
def test_a_completion_and_a_recovery_locking_in_opposite_orders_refund_once(
    book: Book, call_key: str | None
) -> None:
    """The recovery locked the balance and waits for the call's row; the
    completion locked the call's row and waits for the balance: PostgreSQL
    breaks the deadlock, and whichever transaction survives refunds alone."""
    charged_call(book, call_key)
    recovery, late = book.session("SERIALIZABLE"), book.session()
    recovery.start(recover("c1", call_key), pause_before="UPDATE calls" if call_key else "DELETE FROM calls")
    recovery.wait("paused")
    late.start(complete("c1", refund=True, keyed=call_key is not None))
    book.blocked(late)
    recovery.resume()
    recovery.wait("returned")
    late.wait("returned")
    errors = [s.error for s in (recovery, late) if s.error is not None]
    assert len(errors) == 1
    assert is_retryable(errors[0])
    for s in (recovery, late):
        if s.error is None:
            s.commit()
        else:
            s.rollback()
    # The loser runs again, as the executor would run it, and changes nothing.
    if recovery.error is not None:
        book.run(recover("c1", call_key))
    else:
        assert book.run(RowLocked(complete("c1", refund=True, keyed=call_key is not None))) is None
    assert len(refunds(book)) == 1
    assert book.balance(PEER) == 100
    book.check()


# -- several paid-call operations of one batch -------------------------------------------------


def run_batch(book: Book, ops: list[Callable[[Any], Any]]) -> list[Slot[Any]]:
    """``ops`` as one batch of the executor (what concurrent callers queued
    while its previous transaction committed)."""
    slots: list[Slot[Any]] = [Slot(op) for op in ops]
    book.executor._execute(slots)
    return slots


def test_an_operation_failing_in_a_batch_rolls_back_only_itself(book: Book) -> None:
    book.credit(PEER, 100)
    book.credit(OTHER, 100)
    assert book.run(RowLocked(charge("used", "k0"))) == (True, 70)
    slots = run_batch(
        book,
        [
            RowLocked(charge("c1", "k1")),
            RowLocked(charge("used", "k2")),
            RowLocked(charge("c3", "k3", peer=OTHER)),
        ],
    )
    assert [s.result for s in slots] == [(True, 40), None, (True, 70)]
    assert slots[1].error is not None
    assert "duplicate key" in str(slots[1].error)
    assert (book.balance(PEER), book.balance(OTHER)) == (40, 70)
    assert book.executor.retries == 0
    book.check()


def test_one_key_twice_in_one_batch_is_charged_once(book: Book) -> None:
    book.credit(PEER, 100)
    slots = run_batch(book, [RowLocked(charge("c1", "k")), RowLocked(charge("c2", "k"))])
    assert [s.result for s in slots] == [(True, 70), KeyHolder("running", None, None)]
    book.check()


def test_a_batch_rolled_back_by_a_lock_wait_applies_each_charge_once(book: Book) -> None:
    """One operation of the batch waits past the lock timeout for a row
    another process holds: the whole batch is rolled back and each of its
    operations runs again on its own, the blocked one once the row is
    free; every charge lands exactly once."""
    book.credit(PEER, 100)
    book.credit(OTHER, 100)
    other = book.session()
    other.start(charge("held", "kh", peer=OTHER))
    other.wait("returned")
    done = threading.Event()
    slots: list[Slot[Any]] = []

    def batch() -> None:
        slots.extend(
            run_batch(book, [RowLocked(charge("c1", "k1")), RowLocked(charge("c2", "k2", peer=OTHER))])
        )
        done.set()

    worker = threading.Thread(target=batch, daemon=True)
    worker.start()
    # The executor's lock timeout is real time: wait on the batch's own
    # progress (its retry count), bounded, never for a fixed time.
    for _ in range(int(STEP / 0.01)):
        if book.executor.retries >= 2 or done.wait(0.01):
            break
    assert not done.is_set()
    assert book.executor.retries >= 2
    assert other.commit() == (True, 70)
    worker.join(STEP)
    assert [s.result for s in slots] == [(True, 70), (True, 40)]
    assert (book.balance(PEER), book.balance(OTHER)) == (70, 40)
    book.check()


# -- any interleaving, statement by statement --------------------------------------------------

#: What one explored operation is: ("charge", key or None, gc) (``gc``: first
#: sweeping expired records), ("complete", call, refund), ("recover", call) or ("tip",).
Step = tuple[Any, ...]
#: The calls charged before the interleaving: id -> callKey.
PRECHARGED = {"p1": "kp", "p2": None}

steps = st.one_of(
    st.tuples(st.just("charge"), st.sampled_from(["k1", "k2", None]), st.booleans()),
    st.tuples(st.just("complete"), st.sampled_from(sorted(PRECHARGED)), st.booleans()),
    st.tuples(st.just("recover"), st.sampled_from(sorted(PRECHARGED))),
    st.tuples(st.just("tip")),
)


def explored_op(index: int, step: Step) -> tuple[Callable[[Any], Any], str]:
    """The store operation of ``step`` (the ``index``-th) and its isolation."""
    kind = step[0]
    if kind == "charge":
        return charge(f"n{index}", step[1], ts=10.0, gc=step[2]), "READ COMMITTED"
    if kind == "complete":
        return complete(step[1], refund=step[2], keyed=PRECHARGED[step[1]] is not None), "READ COMMITTED"
    if kind == "recover":
        return recover(step[1], PRECHARGED[step[1]]), "SERIALIZABLE"
    return tip(100 + index, 20), "SERIALIZABLE"


def interleave(book: Book, ops: list[tuple[Callable[[Any], Any], str]], rng: random.Random) -> list[Session]:
    """Run ``ops`` in sessions of their own, all open at once, advancing a
    session chosen by ``rng`` one statement (or its commit) at a time; a
    session waiting for a lock stays put until the holder moves on. Returns
    the sessions once every transaction ended."""
    sessions = [book.session(isolation) for _op, isolation in ops]
    state: dict[int, str] = {}
    for n, (s, (op, _)) in enumerate(zip(sessions, ops, strict=True)):
        s.start(op, pause_before=STEP_ALL)
        state[n] = "running"

    def settle(n: int) -> None:
        """Wait for session ``n``'s next stop, or until it waits for a lock."""
        for _ in range(int(STEP / 0.002)):
            try:
                state[n] = sessions[n].events.get(timeout=0.002)
                return
            except queue.Empty:
                if book.waits(sessions[n]):
                    return
        pytest.fail(f"session {n} neither stopped nor waited for a lock")

    for n in state:
        settle(n)
    for _ in range(int(STEP / 0.002)):
        for n, s in enumerate(sessions):
            if state[n] == "running":
                with contextlib.suppress(queue.Empty):
                    state[n] = s.events.get_nowait()
        if all(v == "ended" for v in state.values()):
            return sessions
        ready = [n for n, v in state.items() if v in ("paused", "returned")]
        if not ready:  # every open session waits for a lock: PostgreSQL breaks the deadlock
            with contextlib.suppress(queue.Empty):
                n = next(n for n, v in state.items() if v == "running")
                state[n] = sessions[n].events.get(timeout=0.002)
            continue
        n = rng.choice(ready)
        if state[n] == "paused":
            sessions[n].resume()
        else:
            sessions[n].end()
        state[n] = "running"
        settle(n)
    pytest.fail(f"the interleaving did not finish: {state}")


def succeeded(result: Any) -> bool:
    """Whether a charge's result is a debit."""
    return isinstance(result, tuple) and result[0] is True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(steps, min_size=2, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_any_interleaving_of_paid_call_transactions_keeps_the_books_exact(
    postgres_server: Any, plan: list[Step], seed: int
) -> None:
    """Charges (two keys, one of them held by an expired record, and
    unkeyed), completions and sibling recoveries of two charged calls, and
    tips, interleaved statement by statement; a transaction PostgreSQL
    rolled back (serialization failure, deadlock) runs again afterwards, as
    the executor runs it. Then: the books are exact, a key is charged at
    most once and answered as held only when charged, and a charged call is
    refunded at most once -- exactly once when every settlement asked for
    a refund."""
    url = postgres_server.create_database()
    book = Book(url)
    try:
        book.credit(PEER, 200)
        for call_id, call_key in PRECHARGED.items():
            assert book.run(RowLocked(charge(call_id, call_key)))[0]
        assert book.run(RowLocked(charge("old", "k2", ts=1.0)))[0]
        book.run(RowLocked(complete("old", refund=False)))  # its window ends at 9.0
        ops = [explored_op(n, step) for n, step in enumerate(plan)]
        sessions = interleave(book, ops, random.Random(seed))
        results: list[Any] = []
        for s, (op, isolation) in zip(sessions, ops, strict=True):
            if s.error is None:
                results.append(s.result)
                continue
            assert is_retryable(s.error), s.error
            results.append(book.run(RowLocked(op) if isolation == "READ COMMITTED" else op))
        book.check()
        for key in ("k1", "k2"):
            mine = [r for step, r in zip(plan, results, strict=True) if step[:2] == ("charge", key)]
            assert sum(1 for r in mine if succeeded(r)) <= 1, mine
            if any(isinstance(r, KeyHolder) for r in mine):
                assert any(succeeded(r) for r in mine), mine
        charged = [r for step, r in zip(plan, results, strict=True) if step[0] == "charge" and succeeded(r)]
        movements = book.watch.execute("SELECT ref FROM movements WHERE kind = 'charge'").fetchall()
        assert len(movements) == len(PRECHARGED) + 1 + len(charged)
        for call_id in PRECHARGED:
            settlers = [step for step in plan if step[0] in ("complete", "recover") and step[1] == call_id]
            got = book.watch.execute(
                "SELECT count(*) FROM movements WHERE ref = %s", (f"refund:{call_id}",)
            ).fetchone()
            assert got is not None
            count = int(got[0])
            assert count <= 1
            if settlers and all(step[0] == "recover" or step[2] for step in settlers):
                assert count == 1, (settlers, count)
            if not any(step[0] == "recover" or step[2] for step in settlers):
                assert count == 0
            in_flight = book.watch.execute(
                "SELECT count(*) FROM calls WHERE call_id = %s AND state <> 'done'", (call_id,)
            ).fetchone()
            assert in_flight is not None
            assert int(in_flight[0]) == (0 if settlers else 1)
    finally:
        book.close()
        postgres_server.drop_database(url)
