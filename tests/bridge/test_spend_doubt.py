"""Payments whose outcome is not known yet (BRIDGE.md §Spend log and
approvals, §Failures): spend entries name their call's callKey; a tip that
brclient retries later stays ``pending`` and counted until its late outcome;
entries left pending by an earlier process are in doubt, listed and adopted
one call at a time; TipMatcher routes a stalled tip's later events to the
spend log, past newer payments."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import cast

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from brmcp import PaymentRequired
from brmcp.bridge import ManualClock, Settings, TipMatcher
from brmcp.bridge.links import BotLink
from brmcp.bridge.pay import (
    SPEND_FILE,
    CallBudget,
    Decider,
    Listing,
    Settler,
    SpendEntry,
    SpendLog,
    arguments_hash,
)
from tests.kit.bridge import until

BOT = "a" * 64
OTHER = "b" * 64
NOW = 1_800_000_000
KEY = "0123456789abcdef0123456789abcdef"
STALLED = "tip cannot complete now: no wallet; brclient retries it later, so it may still land"


class StalledTip(Exception):
    """The daemon's TipStalledError, as any payer may raise it."""

    may_land = True


class Payer:
    """Records every pay; ``outcomes`` says what each one does, in order:
    ``"paid"``, ``"stall"`` (may still land), ``"fail"`` or ``"hang"`` (until
    cancelled). ``release`` gates each pay when set."""

    def __init__(self, *outcomes: str) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, int]] = []
        self.release: anyio.Event | None = None
        self.entered = anyio.Event()

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.calls.append((payee_uid, atoms))
        self.entered.set()
        if self.release is not None:
            await self.release.wait()
        outcome = self.outcomes.pop(0)
        if outcome == "stall":
            raise StalledTip(STALLED)
        if outcome == "fail":
            raise RuntimeError("no route to bot")
        if outcome == "hang":
            await anyio.sleep_forever()


def _settings(**changes: object) -> Settings:
    base = Settings(
        enabled=True,
        token="t" * 32,
        mode="autopay",
        per_call_cap_atoms=10_000,
        per_day_cap_atoms=500,
        allowed_bots=(BOT, OTHER),
        tip_wait_secs=5,
    )
    return base.replace(**changes)


def _settler(path: Path, payer: Payer, settings: Settings | None = None) -> Settler:
    current = settings or _settings()
    return Settler(
        spend=SpendLog.load(path),
        payer=payer,
        clock=ManualClock(NOW, auto=True),
        settings=lambda: current,
    )


def _refusal(atoms: int = 500, tool: str = "paid") -> PaymentRequired:
    return PaymentRequired(tool=tool, price_atoms=atoms, balance_atoms=0, shortfall_atoms=atoms)


def _on_disk(path: Path) -> list[dict[str, object]]:
    value = json.loads(path.read_text())
    assert isinstance(value, list)
    return value


# -- callKey in the spend log -------------------------------------------------------


async def test_the_pending_entry_written_before_paying_names_the_call_key(tmp_path: Path) -> None:
    """The entry is on disk, pending and with the callKey, before the payer
    runs; the key stays when it is paid, and the file keeps the Go key
    order with ``callKey`` last."""
    path = tmp_path / SPEND_FILE
    payer = Payer("paid")
    payer.release = anyio.Event()
    settler = _settler(path, payer)
    outcome: list[str | None] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def settle() -> None:
                outcome.append(await settler.settle(BOT, "paid", _refusal(), call_key=KEY))

            tg.start_soon(settle)
            await payer.entered.wait()
            assert _on_disk(path) == [
                {
                    "ts": NOW,
                    "bot": BOT,
                    "tool": "paid",
                    "rail": "tip",
                    "atoms": 500,
                    "status": "pending",
                    "callKey": KEY,
                }
            ]
            payer.release.set()
    assert outcome == [None]
    assert list(_on_disk(path)[0]) == ["ts", "bot", "tool", "rail", "atoms", "status", "callKey"]
    assert _on_disk(path)[0]["status"] == "paid"
    assert SpendLog.load(path).entries[0].call_key == KEY
    # The books: one pay, one paid entry of the same amount.
    assert payer.calls == [(BOT, 500)]
    assert [(e.atoms, e.status) for e in settler.summary().entries] == [(500, "paid")]


def test_call_key_is_read_as_go_reads_keys_and_omitted_when_unknown(tmp_path: Path) -> None:
    path = tmp_path / SPEND_FILE
    path.write_text(
        json.dumps(
            [
                {"ts": NOW, "bot": BOT, "tool": "a", "rail": "tip", "atoms": 1},
                {"ts": NOW, "bot": BOT, "tool": "b", "rail": "tip", "atoms": 2, "CALLKEY": KEY},
                {"ts": NOW, "bot": BOT, "tool": "c", "rail": "tip", "atoms": 3, "callKey": None},
                {"ts": NOW, "bot": BOT, "tool": "d", "rail": "tip", "atoms": 4, "unknown": [1]},
            ]
        )
    )
    log = SpendLog.load(path)
    assert [e.call_key for e in log.entries] == [None, KEY, None, None]
    assert "callKey" not in SpendEntry(ts=NOW, bot=BOT, tool="a").to_dict()
    assert SpendEntry(ts=NOW, bot=BOT, tool="a", call_key=KEY).to_dict()["callKey"] == KEY
    log.write(log.prepare(NOW))
    assert [e.get("callKey") for e in _on_disk(path)] == [None, KEY, None, None]


# -- a tip that may still land stays counted ----------------------------------------


async def test_a_tip_that_may_still_land_stays_pending_and_counted_until_its_late_outcome(
    tmp_path: Path,
) -> None:
    """Day cap 500: a stalled 500-atom tip keeps it used, so a second
    payment is refused instead of letting twice the cap leave the wallet;
    brclient's terminal "will not retry" frees it, and the next payment
    goes through."""
    path = tmp_path / SPEND_FILE
    payer = Payer("stall", "paid")
    settler = _settler(path, payer)
    with anyio.fail_after(10):
        assert await settler.settle(BOT, "paid", _refusal(), call_key=KEY) == STALLED
        entry = settler.summary().entries[0]
        assert (entry.status, entry.err, entry.call_key) == ("pending", STALLED, KEY)
        assert settler.summary().day_total_atoms == 500
        assert _on_disk(path)[0]["status"] == "pending"
        second = await settler.settle(BOT, "paid", _refusal())
        assert second == "500 atoms would exceed the daily cap (500 spent of 500)"
        assert payer.calls == [(BOT, 500)]
        # The stalled tip is in doubt: no call is paying it right now.
        (doubt,) = settler.in_doubt(BOT)
        assert (doubt.tool, doubt.atoms, doubt.call_key, doubt.ts) == ("paid", 500, KEY, NOW)
        # brclient gives up on it for good: failed, no longer counted.
        assert await settler.resolve(BOT, 500, "will not retry: no wallet")
        assert doubt.status == "failed"
        assert settler.summary().day_total_atoms == 0
        assert settler.in_doubt(BOT) == []
        assert await settler.settle(BOT, "paid", _refusal()) is None
    assert payer.calls == [(BOT, 500), (BOT, 500)]
    assert [(e.atoms, e.status) for e in SpendLog.load(path).entries] == [(500, "failed"), (500, "paid")]


async def test_a_stalled_tip_that_completes_later_turns_paid(tmp_path: Path) -> None:
    path = tmp_path / SPEND_FILE
    payer = Payer("stall")
    settler = _settler(path, payer)
    with anyio.fail_after(10):
        assert await settler.settle(BOT, "paid", _refusal()) == STALLED
        assert await settler.resolve(BOT.upper(), 500, None)
    assert [(e.atoms, e.status, e.err) for e in SpendLog.load(path).entries] == [(500, "paid", "")]
    assert payer.calls == [(BOT, 500)]
    assert settler.summary().day_total_atoms == 500


def test_an_older_versions_failed_may_land_entry_is_still_claimed_by_a_late_completion(
    tmp_path: Path,
) -> None:
    path = tmp_path / SPEND_FILE
    legacy = {"ts": NOW, "bot": BOT, "tool": "p", "rail": "tip", "atoms": 9, "status": "failed"}
    path.write_text(json.dumps([{**legacy, "err": f"x; so it {'may still land'}"}]))
    log = SpendLog.load(path)
    assert log.day_total(NOW) == 0
    assert not log.resolve(BOT, 9, "will not retry")  # only a completion claims it
    assert log.resolve(BOT, 9, None)
    assert log.entries[0].status == "paid"


async def test_a_late_outcome_waits_for_the_payment_still_finishing(tmp_path: Path) -> None:
    """A stall and the terminal event can follow each other faster than the
    stalled payment writes its entry: the late outcome waits for it instead
    of matching nothing (which would leave the entry pending for good)."""
    path = tmp_path / SPEND_FILE
    payer = Payer("stall")
    payer.release = anyio.Event()
    settler = _settler(path, payer)
    resolved: list[bool] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(settler.settle, BOT, "paid", _refusal())
            await payer.entered.wait()

            async def late() -> None:
                resolved.append(await settler.resolve(BOT, 500, None))

            tg.start_soon(late)
            await anyio.wait_all_tasks_blocked()
            assert resolved == []  # the entry is still being paid
            payer.release.set()
    assert resolved == [True]
    assert [e.status for e in settler.summary().entries] == ["paid"]
    # Nothing of that payee and amount in flight: a stray outcome matches nothing at once.
    assert not await settler.resolve(BOT, 700, None)


# -- in doubt and adoption -----------------------------------------------------------


def _earlier_process(path: Path) -> None:
    """A spend log an earlier process left: two payments in doubt for
    ``paid`` (one without a callKey: an older version), one for ``other``,
    one for another bot, and settled ones."""

    def row(ago: int, tool: str, atoms: int, status: str, bot: str = BOT) -> dict[str, object]:
        return {"ts": NOW - ago, "bot": bot, "tool": tool, "rail": "tip", "atoms": atoms, "status": status}

    rows = [
        row(50, "paid", 500, "paid"),
        row(40, "paid", 500, "pending", BOT.upper()),
        row(30, "paid", 500, "pending"),
        row(20, "other", 7, "pending"),
        row(10, "paid", 500, "pending", OTHER),
        {**row(5, "paid", 500, "failed"), "err": "x"},
    ]
    rows[2]["callKey"] = KEY
    path.write_text(json.dumps(rows))


async def test_in_doubt_lists_what_an_earlier_process_left_pending(tmp_path: Path) -> None:
    path = tmp_path / SPEND_FILE
    _earlier_process(path)
    settler = _settler(path, Payer())
    doubts = settler.in_doubt(BOT)
    assert [(d.tool, d.atoms, d.ts, d.call_key) for d in doubts] == [
        ("paid", 500, NOW - 40, None),
        ("paid", 500, NOW - 30, KEY),
        ("other", 7, NOW - 20, None),
    ]
    assert [d.status for d in doubts] == ["pending"] * 3
    assert [(d.tool, d.ts) for d in settler.in_doubt(OTHER.upper())] == [("paid", NOW - 10)]
    # All of them still count against the day cap.
    assert settler.summary().day_total_atoms == 500 + 500 + 500 + 7 + 500


async def test_adopt_gives_each_entry_in_doubt_to_one_call_until_released(tmp_path: Path) -> None:
    path = tmp_path / SPEND_FILE
    _earlier_process(path)
    settler = _settler(path, Payer())
    first = settler.adopt(BOT, "paid")
    second = settler.adopt(BOT, "paid")
    assert first is not None
    assert second is not None
    assert (first.ts, first.call_key, first.adopted) == (NOW - 40, None, True)
    assert (second.ts, second.call_key) == (NOW - 30, KEY)
    assert settler.adopt(BOT, "paid") is None  # two calls never share one
    assert settler.adopt(BOT, "unknown") is None
    assert [d.adopted for d in settler.in_doubt(BOT)] == [True, True, False]
    settler.release_adopted(first)
    settler.release_adopted(first)  # idempotent
    again = settler.adopt(BOT, "paid")
    assert again == first
    assert again is not first  # a new handle on the same entry
    # The adopter waits for the late outcome; adoption wrote nothing.
    before = path.read_text()
    settled: list[str] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def wait() -> None:
                settled.append(await second.wait_settled())

            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert settled == []
            assert path.read_text() == before
            # The oldest pending entry of that payee and amount is claimed first.
            assert await settler.resolve(BOT, 500, None)
            assert first.status == "paid"
            assert settled == []
            assert await settler.resolve(BOT, 500, "will not retry")
    assert settled == ["failed"]
    assert second.err == "will not retry"
    assert await first.wait_settled() == "paid"
    assert [d.tool for d in settler.in_doubt(BOT)] == ["other"]


async def test_a_payment_in_flight_is_not_in_doubt_until_its_wait_ends(tmp_path: Path) -> None:
    path = tmp_path / SPEND_FILE
    payer = Payer("hang")
    settler = _settler(path, payer, _settings(tip_wait_secs=1))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            outcome: list[str | None] = []

            async def settle() -> None:
                outcome.append(await settler.settle(BOT, "paid", _refusal(), call_key=KEY))

            tg.start_soon(settle)
            await payer.entered.wait()
            assert settler.in_doubt(BOT) == []
            assert settler.adopt(BOT, "paid") is None
            await until(lambda: bool(outcome))
    assert outcome == ["tip not confirmed within 1s; the attempt keeps running"]
    (doubt,) = settler.in_doubt(BOT)
    assert (doubt.call_key, doubt.status) == (KEY, "pending")
    assert "may still land" in doubt.err
    assert payer.calls == [(BOT, 500)]


# -- TipMatcher: a stalled tip's later events --------------------------------------


@pytest.mark.parametrize("outcome", [None, "will not retry"])
async def test_events_of_a_stalled_tip_pass_newer_waiters(outcome: str | None) -> None:
    """brclient pays one payee one tip at a time and a stalled tip holds the
    later ones: its retried attempts and its terminal event come before any
    event of a newer tip of the same amount, so they must not end that
    newer payment's wait (the terminal one settles the spend log instead)."""
    matcher = TipMatcher()
    stalled = matcher.expect(BOT, 500_000)
    assert matcher.stall(BOT.upper(), 500_000, "no wallet")
    assert (stalled.done, stalled.stalled, stalled.error) == (True, True, "no wallet")
    newer = matcher.expect(BOT, 500_000)
    assert not matcher.stall(BOT, 500_000, "no wallet")  # the stalled tip's next attempt
    assert not matcher.resolve(BOT, 500_000, outcome)  # its terminal event: a late outcome
    assert not newer.done
    assert matcher.stalled() == 0
    assert matcher.resolve(BOT, 500_000, None)  # the newer tip's own outcome
    assert (newer.done, newer.stalled, newer.error) == (True, False, None)
    assert matcher.waiting() == 0


def test_a_stall_of_another_amount_or_payee_does_not_hold_back_waiters() -> None:
    matcher = TipMatcher()
    first = matcher.expect(BOT, 500_000)
    assert matcher.stall(BOT, 500_000, "x")
    assert first.stalled
    other_amount = matcher.expect(BOT, 700_000)
    other_payee = matcher.expect(OTHER, 500_000)
    assert matcher.resolve(BOT, 700_000)
    assert matcher.resolve(OTHER, 500_000, "failed")
    assert (other_amount.error, other_payee.error) == (None, "failed")
    assert matcher.stalled() == 1


# -- through the daemon and the fake brclient ------------------------------------------


async def test_a_tip_brclient_gives_up_on_is_waited_for_then_the_call_pays_anew(tmp_path: Path) -> None:
    """The daemon, day cap one fortune: the tip's first attempt fails and
    brclient will retry it: the agent hears at once, the spend stays pending
    and counted. The agent's identical second call finds that payment in
    doubt and waits for its outcome instead of paying beside it or failing:
    brclient's later attempts fail too, its terminal "will not retry" turns
    the entry failed (no longer counted), and the call then pays anew within
    the cap and is answered. The books: two TipUser, one tip credited at the
    bot and charged once, the first entry failed and the second paid."""
    from brmcp.testing.fakebr import TipFailure
    from tests.bridge.test_daemon import agent, bridge_settings, running_daemon
    from tests.kit.serve import serve_network

    with anyio.fail_after(120):
        async with serve_network(tmp_path) as env:
            bot, alice = env.bot, env.alice
            settings = bridge_settings(bot.uid, per_day_cap_atoms=10_000, tip_wait_secs=600)
            async with running_daemon(env, tmp_path / "bridge", settings) as daemon:
                url = f"{daemon.base_url}/mcp/{bot.uid}"
                error = "fake relay: invoice request timed out"
                alice.fail_next_tip(TipFailure(attempts=3, error=error, delay=1.0))
                async with agent(url) as s:
                    first = await s.call_tool("fortune", {})
                    assert first.is_error
                    assert first.content[-1].type == "text"
                    assert f"payment not made: tip cannot complete now: {error}" in first.content[-1].text
                    (entry,) = daemon.bridge.spend_log().entries
                    assert (entry.atoms, entry.status) == (10_000, "pending")
                    assert daemon.bridge.spend_log().day_total_atoms == 10_000
                    second = await s.call_tool("fortune", {})
                    assert not second.is_error, second
                failed, paid = daemon.bridge.spend_log().entries
                assert (failed.atoms, failed.status) == (10_000, "failed")
                assert error in failed.err
                assert (paid.atoms, paid.status) == (10_000, "paid")
                assert daemon.bridge.spend_log().day_total_atoms == 10_000
                assert daemon.matcher.stalled() == 0
            tips = [p for m, p in alice.requests if m == "PaymentsService.TipUser"]
            assert tips == [{"user": bot.uid, "dcrAmount": 0.0001, "maxAttempts": 3}] * 2
            statement = await env.app.harness.statement(alice.uid)
            assert sorted((e.kind, e.atoms) for e in statement) == [("charge", -10_000), ("tip", 10_000)]
            assert await env.app.harness.balance(alice.uid) == 0


# -- the same call after a restart: its tool and arguments ---------------------------


ARGS = {"topic": "tides", "depth": 2}


@given(
    st.dictionaries(
        st.text(max_size=8),
        st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.none()),
        max_size=6,
    )
)
def test_the_arguments_hash_is_the_sha256_of_canonical_json_whatever_the_key_order(
    arguments: dict[str, object],
) -> None:
    reordered = dict(reversed(list(arguments.items())))
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert arguments_hash(arguments) == hashlib.sha256(canonical.encode()).hexdigest()
    assert arguments_hash(reordered) == arguments_hash(arguments)
    assert len(arguments_hash(arguments)) == 64


def test_no_arguments_hash_as_empty_arguments() -> None:
    assert arguments_hash(None) == arguments_hash({}) == hashlib.sha256(b"{}").hexdigest()


async def test_the_entry_on_disk_before_paying_names_the_tool_and_arguments_hash(tmp_path: Path) -> None:
    """Before the payer runs (money moves), the pending entry on disk holds
    bot, tool, callKey and argsHash; the added keys come after the Go ones,
    and the file loads back with them."""
    path = tmp_path / SPEND_FILE
    payer = Payer("paid")
    payer.release = anyio.Event()
    settler = _settler(path, payer)
    digest = arguments_hash(ARGS)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def settle() -> None:
                await settler.settle(BOT, "paid", _refusal(), call_key=KEY, args_hash=digest)

            tg.start_soon(settle)
            await payer.entered.wait()
            (entry,) = _on_disk(path)
            assert entry == {
                "ts": NOW,
                "bot": BOT,
                "tool": "paid",
                "rail": "tip",
                "atoms": 500,
                "status": "pending",
                "callKey": KEY,
                "argsHash": digest,
            }
            assert list(entry)[:5] == ["ts", "bot", "tool", "rail", "atoms"]
            payer.release.set()
    (loaded,) = SpendLog.load(path).entries
    assert (loaded.status, loaded.call_key, loaded.args_hash) == ("paid", KEY, digest)
    assert payer.calls == [(BOT, 500)]


def _left_pending(path: Path, *entries: tuple[str, str, str | None], scheduled: bool = True) -> None:
    """Entries (tool, callKey, argsHash) an earlier process left pending, 60 s
    ago; ``scheduled``: brclient had taken their tips."""
    rows = []
    for tool, key, digest in entries:
        row: dict[str, object] = {"ts": NOW - 60, "bot": BOT, "tool": tool, "rail": "tip", "atoms": 500}
        row |= {"status": "pending", "callKey": key}
        if scheduled:
            row["scheduled"] = True
        if digest is not None:
            row["argsHash"] = digest
        rows.append(row)
    path.write_text(json.dumps(rows))


async def test_an_identical_call_after_a_restart_takes_over_its_payment_and_no_other(tmp_path: Path) -> None:
    """Two payments an earlier process left pending for the same tool with
    other arguments: a call takes over the one with its own arguments hash
    (and so its callKey), even past the tip wait; a call with arguments
    neither paid for claims none; an entry of an older version (no hash)
    is claimed by tool alone, as before."""
    path = tmp_path / SPEND_FILE
    other_key = "f" * 32
    _left_pending(
        path,
        ("paid", other_key, arguments_hash({"topic": "moon"})),
        ("paid", KEY, arguments_hash(ARGS)),
    )
    settler = _settler(path, Payer())
    stale = NOW  # every entry is older than any tip wait
    mine = settler.adopt(BOT, "paid", newer_than=stale, args_hash=arguments_hash(ARGS))
    assert mine is not None
    assert mine.call_key == KEY
    assert settler.adopt(BOT, "paid", args_hash=arguments_hash({"topic": "sun"})) is None
    assert settler.adopt(BOT, "other", args_hash=arguments_hash({"topic": "moon"})) is None
    legacy = tmp_path / "legacy.json"
    _left_pending(legacy, ("paid", KEY, None))
    old = _settler(legacy, Payer()).adopt(BOT, "paid", args_hash=arguments_hash(ARGS))
    assert old is not None
    assert old.call_key == KEY


async def test_a_payment_left_pending_and_settled_paid_since_is_still_its_calls_once(tmp_path: Path) -> None:
    """The tip an earlier process left in flight lands after the restart,
    before the agent's retry: its call may never have been answered, so the
    identical retry still takes over its callKey (once; a failed one never)."""
    path = tmp_path / SPEND_FILE
    _left_pending(path, ("paid", KEY, arguments_hash(ARGS)), ("paid", "e" * 32, arguments_hash({"a": 1})))
    settler = _settler(path, Payer())
    assert await settler.resolve(BOT, 500, None)
    assert await settler.resolve(BOT, 500, "no route")
    assert [e.status for e in settler.summary().entries] == ["paid", "failed"]
    mine = settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS))
    assert mine is not None
    assert (mine.call_key, mine.status) == (KEY, "paid")
    assert settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS)) is None
    assert settler.adopt(BOT, "paid", args_hash=arguments_hash({"a": 1})) is None


# -- a call that counts a payment in doubt waits for its outcome ----------------------


class _Link:
    """The part of a BotLink the decision reads before paying."""

    uid = BOT


def _doubtful(tmp_path: Path, payer: Payer) -> tuple[Settler, Decider, CallBudget]:
    """A settler on a log an earlier process left one pending payment in,
    the decider of its bot, and the budget of the identical call that took
    that payment over (as the proxy builds it)."""
    path = tmp_path / SPEND_FILE
    _left_pending(path, ("paid", KEY, arguments_hash(ARGS)))
    current = _settings(per_day_cap_atoms=1_000)
    settler = _settler(path, payer, current)
    decider = Decider(cast(BotLink, _Link()), settler, ManualClock(NOW, auto=True), settings=lambda: current)
    adopted = settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS))
    assert adopted is not None
    budget = CallBudget(Listing("fixed", 500), in_doubt=adopted.atoms, doubt=adopted)
    budget.add(adopted.atoms)
    return settler, decider, budget


@pytest.mark.parametrize("outcome", ["paid", "failed"])
async def test_a_refused_call_waits_for_the_payment_in_doubt_then_runs_on_it_or_pays(
    tmp_path: Path, outcome: str
) -> None:
    """The bot refuses while the tip is still in flight: the decision waits
    for brclient's outcome instead of answering at once. Landed: nothing is
    paid (ask again on its credit). Failed: no longer counted, the call pays
    once within the caps. The books to the atom: payer calls, entries, day
    total, the call's budget."""
    payer = Payer("paid")
    settler, decider, budget = _doubtful(tmp_path, payer)
    decided: list[object] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def decide() -> None:
                deadline = anyio.current_time() + 30
                decided.append(
                    await decider.decide(
                        "paid",
                        _refusal(),
                        budget,
                        KEY,
                        None,
                        deadline=deadline,
                        args_hash=arguments_hash(ARGS),
                    )
                )

            tg.start_soon(decide)
            await anyio.wait_all_tasks_blocked()
            assert decided == []  # waiting for the outcome, not answering
            assert await settler.resolve(BOT, 500, None if outcome == "paid" else "no route")
    assert decided == [None]
    entries = settler.summary().entries
    if outcome == "paid":
        assert payer.calls == []
        assert [(e.status, e.call_key) for e in entries] == [("paid", KEY)]
    else:
        assert payer.calls == [(BOT, 500)]
        assert [(e.status, e.call_key) for e in entries] == [("failed", KEY), ("paid", KEY)]
        assert entries[1].args_hash == arguments_hash(ARGS)
    assert settler.summary().day_total_atoms == 500
    assert (budget.paid_atoms, budget.payments, budget.in_doubt, budget.doubt) == (500, 1, 0, None)


async def test_when_the_deadline_passes_in_doubt_the_call_says_what_and_that_a_retry_uses_it(
    tmp_path: Path,
) -> None:
    payer = Payer()
    settler, decider, budget = _doubtful(tmp_path, payer)
    with anyio.fail_after(10):
        reason = await decider.decide(
            "paid", _refusal(), budget, KEY, None, deadline=anyio.current_time() + 0.05
        )
    assert isinstance(reason, str)
    assert "500 atoms" in reason
    assert "still in doubt" in reason
    assert KEY[:8] in reason
    assert "a retry of this call with the same arguments uses that payment" in reason
    assert payer.calls == []
    assert [e.status for e in settler.summary().entries] == ["pending"]
    assert settler.summary().day_total_atoms == 500


async def test_an_answered_takeover_is_never_taken_over_again_nor_after_a_restart(tmp_path: Path) -> None:
    """A call that took over an entry left pending was answered under its
    callKey: the next identical call is a new call, so it must not take
    that callKey over (the bot would answer it with the first call's stored
    result, uncharged); the mark is on disk, so a restarted bridge agrees.
    The entry itself stays pending and counted until its own outcome."""
    path = tmp_path / SPEND_FILE
    _left_pending(path, ("paid", KEY, arguments_hash(ARGS)))
    settler = _settler(path, Payer())
    first = settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS))
    assert first is not None
    await settler.mark_answered(first)
    settler.release_adopted(first)
    assert settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS)) is None
    assert settler.adopt(BOT, "paid") is None
    assert [(e["status"], e.get("answered")) for e in _on_disk(path)] == [("pending", True)]
    restarted = _settler(path, Payer())
    assert restarted.adopt(BOT, "paid", args_hash=arguments_hash(ARGS)) is None
    assert restarted.summary().day_total_atoms == 500
    assert [d.call_key for d in restarted.in_doubt(BOT)] == [KEY]
    assert await restarted.resolve(BOT, 500, None)
    assert [(e.status, e.answered) for e in restarted.summary().entries] == [("paid", True)]


@pytest.mark.parametrize("scheduled", [False, True])
async def test_a_payment_in_doubt_blocks_a_call_only_within_its_window(
    tmp_path: Path, scheduled: bool
) -> None:
    """An entry left pending 60 s ago whose TipUser never returned (not
    scheduled) blocks a second payment for tip_wait_secs (5 s) only: the
    call taking it over does not wait its whole deadline for an outcome that
    nothing may ever report; it pays, once, under the same callKey. One the
    wallet took blocks for a day: the call waits until its deadline and is
    told what is in doubt, paying nothing."""
    path = tmp_path / SPEND_FILE
    _left_pending(path, ("paid", KEY, arguments_hash(ARGS)), scheduled=scheduled)
    current = _settings(per_day_cap_atoms=1_000)
    payer = Payer("paid")
    settler = _settler(path, payer, current)
    decider = Decider(cast(BotLink, _Link()), settler, ManualClock(NOW, auto=True), settings=lambda: current)
    adopted = settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS))
    assert adopted is not None
    budget = CallBudget(Listing("fixed", 500), in_doubt=adopted.atoms, doubt=adopted)
    budget.add(adopted.atoms)
    started = anyio.current_time()
    with anyio.fail_after(10):
        reason = await decider.decide(
            "paid", _refusal(), budget, KEY, None, deadline=started + 0.5, args_hash=arguments_hash(ARGS)
        )
    entries = settler.summary().entries
    if scheduled:
        assert isinstance(reason, str)
        assert "still in doubt" in reason
        assert anyio.current_time() - started >= 0.5
        assert payer.calls == []
        assert [e.status for e in entries] == ["pending"]
        assert settler.summary().day_total_atoms == 500
    else:
        assert reason is None
        assert anyio.current_time() - started < 0.5
        assert payer.calls == [(BOT, 500)]
        assert [(e.status, e.call_key) for e in entries] == [("pending", KEY), ("paid", KEY)]
        # Both count in the day until the first one's outcome arrives.
        assert settler.summary().day_total_atoms == 1_000
        assert (budget.paid_atoms, budget.payments, budget.in_doubt) == (500, 1, 0)


def _left_paid(path: Path, *entries: tuple[str, int, bool]) -> None:
    """Entries (callKey, age in s, answered) an earlier process left ``paid``
    for ``paid`` with :data:`ARGS`."""
    rows = []
    for key, age, answered in entries:
        row: dict[str, object] = {"ts": NOW - age, "bot": BOT, "tool": "paid", "rail": "tip", "atoms": 500}
        row |= {"status": "paid", "callKey": key, "scheduled": True, "argsHash": arguments_hash(ARGS)}
        if answered:
            row["answered"] = True
        rows.append(row)
    path.write_text(json.dumps(rows))


async def test_a_payment_whose_process_died_before_the_result_is_its_identical_calls_once(
    tmp_path: Path,
) -> None:
    """The bridge was killed after its payment was confirmed and written
    ``paid``, before the bot's result reached the agent: the restarted
    bridge gives the identical retry that payment (and its callKey, so the
    bot answers from its record instead of running and charging again),
    once. A paid entry whose call was answered, or one older than the bot's
    replay window, is never taken over; nor is one without an argsHash."""
    path = tmp_path / SPEND_FILE
    answered_key, old_key = "a" * 32, "b" * 32
    _left_paid(path, (answered_key, 60, True), (old_key, 31 * 60, False), (KEY, 60, False))
    settler = _settler(path, Payer())
    recent = NOW - 30 * 60
    mine = settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS), paid_newer_than=recent)
    assert mine is not None
    assert (mine.call_key, mine.status) == (KEY, "paid")
    assert settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS), paid_newer_than=recent) is None
    # Answered under that key now: written, so a second restart agrees.
    await settler.mark_call_answered(KEY)
    restarted = _settler(path, Payer())
    assert restarted.adopt(BOT, "paid", args_hash=arguments_hash(ARGS), paid_newer_than=recent) is None
    assert [e.get("answered") for e in _on_disk(path)] == [True, None, True]
    legacy = tmp_path / "legacy.json"
    row = {"ts": NOW - 60, "bot": BOT, "tool": "paid", "rail": "tip", "atoms": 500, "status": "paid"}
    legacy.write_text(json.dumps([row]))
    assert _settler(legacy, Payer()).adopt(BOT, "paid", args_hash=arguments_hash(ARGS)) is None


async def test_the_newest_entry_of_the_same_call_is_taken_over_first(tmp_path: Path) -> None:
    """Two entries left pending for the same tool and arguments: the agent's
    retry repeats the latest call, so the newest entry (and its callKey) is
    taken over first; the older one only by the next identical call."""
    path = tmp_path / SPEND_FILE
    older, newer = "c" * 32, "d" * 32
    rows = []
    for key, age in ((older, 120), (newer, 30)):
        row: dict[str, object] = {"ts": NOW - age, "bot": BOT, "tool": "paid", "rail": "tip", "atoms": 500}
        row |= {"status": "pending", "callKey": key, "scheduled": True, "argsHash": arguments_hash(ARGS)}
        rows.append(row)
    path.write_text(json.dumps(rows))
    settler = _settler(path, Payer())
    first = settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS))
    second = settler.adopt(BOT, "paid", args_hash=arguments_hash(ARGS))
    assert first is not None
    assert second is not None
    assert (first.call_key, second.call_key) == (newer, older)
