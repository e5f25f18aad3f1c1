"""A callKey whose call was answered is never taken over by a later call
(BRIDGE.md §Failures, "A result never answers a later call"; SECURITY.md).

The bridge lets an agent's identical call take over the callKey of a
payment in doubt (same bot, tool and ``argsHash``), so a retry of a call
whose payment is in doubt is answered from the bot's record instead of
paying and running again. A call paid alongside can be answered, though,
while its own payment is still in doubt: the bot got the tip and ran the
held call, but brclient never confirmed the tip to the bridge. The next
identical call is then a new call; had it taken that callKey over, the bot
would have answered it with the first call's stored result, with no charge
for it (found by tests/seams, PostgreSQL run 36, where a restarted bridge
took over the callKey of a call answered a run earlier).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.types import CallToolResult

import brmcp.bridge.pay._payloop as payloop
from brmcp.bridge import ManualClock
from brmcp.bridge.pay import SPEND_FILE, STATUS_PENDING, Settler, SpendLog, arguments_hash
from tests.kit import BOT, CLIENT
from tests.kit.bridge import START, Env, TestPayer, bridge_env, call, fixture_settings, until

PRICE = 500


class _MayLand(Exception):
    """A tip whose outcome brclient reports later (it may still land)."""

    may_land = True


def _payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result
    assert result.structured_content is not None, result
    return dict(result.structured_content)


async def _charges(env: Env) -> int:
    return sum(1 for e in await env.harness.statement(CLIENT) if e.kind == "charge")


def _entries(env: Env) -> list[dict[str, Any]]:
    return list(json.loads((env.data_dir / SPEND_FILE).read_text()))


async def _answered_while_in_doubt(env: Env) -> str:
    """One paid call answered while its payment stays in doubt: the tip
    lands at the bot (its ledger is credited) and the bot runs the held
    call, but the payer's outcome is "may still land". Returns the callKey
    of that payment's spend entry."""
    landed = anyio.Event()
    gate = anyio.Event()

    async def lands_unconfirmed(payee: str, atoms: int) -> None:
        await env.payer.credit(payee, atoms)
        landed.set()
        await gate.wait()
        raise _MayLand("tip attempt failed; brclient retries it later")

    # A first call, paid and confirmed, tells the bridge the balance, so the
    # next call's payment goes alongside it (the bot holds it until the tip).
    async with env.session() as session:
        assert _payload(await call(session, "paid", {"text": "x"})) == {"n": 1}
    env.payer.behaviour = lands_unconfirmed
    async with env.session() as session:
        assert _payload(await call(session, "paid", {"text": "x"})) == {"n": 2}
    assert landed.is_set()
    gate.set()
    await until(lambda: len(_entries(env)) == 2 and _entries(env)[1].get("status") == STATUS_PENDING)
    env.payer.behaviour = None
    key = _entries(env)[1]["callKey"]
    assert isinstance(key, str)
    return key


async def test_a_call_answered_while_its_payment_is_in_doubt_is_not_answered_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next identical call (a new agent session) runs and is charged on
    its own: a new result, one charge per result; the answered call's
    callKey is never sent again, in this process or after a restart."""
    # The bridge waits this long (real seconds) for the confirmation of a
    # payment the bot already charged before it returns the result.
    monkeypatch.setattr(payloop, "CONFIRM_WAIT", 0.05)
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env:
            key = await _answered_while_in_doubt(env)
            assert await _charges(env) == 2
            async with env.session() as session:
                third = await call(session, "paid", {"text": "x"})
            assert _payload(third) == {"n": 3}
            assert env.executions["paid"] == 3
            assert await _charges(env) == 3
            # To the atom: three tips reached the bot, three results were
            # charged, no credit is left over and none was created.
            assert env.payer.calls == [(BOT, PRICE)] * 3
            assert await env.harness.balance(CLIENT) == 0
            keys = [e["callKey"] for e in _entries(env)]
            assert keys.count(key) == 1, keys
            doubted = [e for e in _entries(env) if e["callKey"] == key]
            assert [(e["status"], e.get("answered")) for e in doubted] == [(STATUS_PENDING, True)]
        # A restarted bridge reads the mark: the entry is still pending and
        # counted (its late outcome settles it), but no call takes it over.
        current = fixture_settings()
        restarted = Settler(
            spend=SpendLog.load(env.data_dir / SPEND_FILE),
            payer=TestPayer(),
            clock=ManualClock(START, auto=True),
            settings=lambda: current,
        )
        assert [d.call_key for d in restarted.in_doubt(BOT)] == [key]
        assert restarted.adopt(BOT, "paid", args_hash=arguments_hash({"text": "x"})) is None
        assert restarted.adopt(BOT, "paid") is None


_KEYS = [f"{n:032x}" for n in range(1, 5)]
_ROW = st.fixed_dictionaries(
    {
        "key": st.sampled_from(_KEYS),
        "status": st.sampled_from(["pending", "paid", "failed"]),
        "scheduled": st.booleans(),
        "same_args": st.booleans(),
        "age": st.integers(0, 600),
    }
)


def _log(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as an earlier process left them in ``mcpspend.json``."""
    out: list[dict[str, Any]] = []
    for row in sorted(rows, key=lambda r: -int(r["age"])):
        entry: dict[str, Any] = {"ts": START - row["age"], "bot": BOT, "tool": "paid", "rail": "tip"}
        entry |= {"atoms": PRICE, "status": row["status"], "callKey": row["key"]}
        if row["scheduled"]:
            entry["scheduled"] = True
        entry["argsHash"] = arguments_hash({"text": "x"} if row["same_args"] else {"text": "y"})
        out.append(entry)
    return out


def _loaded(path: Path, entries: list[dict[str, Any]]) -> Settler:
    path.write_text(json.dumps(entries))
    current = fixture_settings(tip_wait_secs=300)
    return Settler(
        spend=SpendLog.load(path),
        payer=TestPayer(),
        clock=ManualClock(START, auto=True),
        settings=lambda: current,
    )


def _claims(settler: Settler, calls: list[bool]) -> list[str | None]:
    """The callKey each call in turn takes over (None: none), ``True`` for a
    call with the same arguments, ``False`` for a call by tool alone."""
    digest = arguments_hash({"text": "x"})
    taken = []
    for same in calls:
        got = settler.adopt(BOT, "paid", newer_than=START - 300, args_hash=digest if same else None)
        taken.append(None if got is None else got.call_key)
    return taken


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(_ROW, max_size=8),
    answered=st.sets(st.sampled_from(_KEYS)),
    calls=st.lists(st.booleans(), max_size=6),
)
async def test_answered_keys_are_never_taken_over_and_the_rest_as_before(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[dict[str, Any]],
    answered: set[str],
    calls: list[bool],
) -> None:
    """Whatever an earlier process left in the spend log, once the calls of
    ``answered`` are marked (and the log is read again after a restart), no
    call takes over an entry of those callKeys, and every other claim is the
    one made on the log without those entries."""
    entries = _log(rows)
    marked = _loaded(tmp_path_factory.mktemp("marked") / SPEND_FILE, entries)
    for key in sorted(answered):
        await marked.mark_call_answered(key)
    restarted = _loaded(tmp_path_factory.mktemp("restarted") / SPEND_FILE, _entries_of(marked))
    reference = _loaded(
        tmp_path_factory.mktemp("reference") / SPEND_FILE,
        [e for e in entries if e["callKey"] not in answered],
    )
    expected = _claims(reference, calls)
    assert _claims(marked, calls) == expected
    assert _claims(restarted, calls) == expected
    assert not answered & {k for k in expected if k is not None}
    # The marks move no money: every entry is still there, with its status.
    assert [(e.status, e.call_key) for e in restarted.summary().entries] == [
        (e["status"], e["callKey"]) for e in entries
    ]


def _entries_of(settler: Settler) -> list[dict[str, Any]]:
    return [e.to_dict() for e in settler.summary().entries]
