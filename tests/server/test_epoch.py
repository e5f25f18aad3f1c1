"""A held call whose caller process is gone is dropped uncharged (WIRE.md
§Pay alongside, rule 6): a ``tools/call`` under a new
``brmcp/callerEpoch`` drops that caller's calls held under another epoch
and releases their callKey claims before it claims its own, so the new
process's retry runs, and is charged, exactly once. Callers without an
epoch (the Go bridge) see no difference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from hypothesis import given
from hypothesis import strategies as st

from brmcp.protocol.payment import (
    BALANCE_ATOMS_KEY,
    CALL_KEY,
    CALLER_EPOCH_KEY,
    CHARGED_ATOMS_KEY,
    HELD_KEY,
    PAY_ALONGSIDE_KEY,
    caller_epoch,
    parse_payment_required,
)
from brmcp.server import Harness
from brmcp.server.calls._holds import DROPPED_TEXT, CallerEpochs, Hold
from tests.kit import until
from tests.kit.harness import ALICE, BOB, query, served, standard_harness

EPOCH_A = "a" * 16
EPOCH_B = "b" * 16
KEY = "k" * 32


async def _paid(harness: Harness, key: str | None, epoch: str | None, alongside: int = 500) -> Any:
    spec = next(t for t in harness.tools() if t.name == "paid")
    return await harness.call(ALICE, spec, {}, {}, key, alongside=alongside, epoch=epoch)


def waiting_on(harness: Harness, key: str, peer: str = ALICE) -> int:
    """How many duplicates wait on ``peer``'s claim of ``key`` right now
    (what a test waits for instead of sleeping while duplicates arrive)."""
    claim = harness._calls._claims.get((peer, key))
    return 0 if claim is None else claim.event.statistics().tasks_waiting


def _text(result: types.CallToolResult) -> str:
    assert len(result.content) == 1
    item = result.content[0]
    assert isinstance(item, types.TextContent)
    return item.text


def _books(data_dir: Path) -> list[tuple[Any, ...]]:
    return query(data_dir, "SELECT kind, atoms, call_key, balance_after FROM movements ORDER BY id")


async def test_a_new_epoch_drops_the_held_call_and_its_retry_runs_once(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, hold_seconds=30.0)
    async with harness:
        results: dict[str, types.CallToolResult] = {}
        async with anyio.create_task_group() as tg:

            async def send(name: str, epoch: str) -> None:
                results[name] = await _paid(harness, KEY, epoch)

            tg.start_soon(send, "old", EPOCH_A)
            await until(lambda: harness.holds == 1)
            # The bridge restarted: the same call, same key, new epoch.
            tg.start_soon(send, "new", EPOCH_B)
            await until(lambda: "old" in results and harness.holds == 2)
            old = results["old"]
            assert old.is_error
            assert _text(old) == DROPPED_TEXT
            assert parse_payment_required(old) is None
            assert old.meta is None
            assert runs.n == 0
            assert await harness.balance(ALICE) == 0
            assert _books(tmp_path) == []
            # The tip lands: the new process's call runs once, charged once.
            assert await harness.record_tip(ALICE, 500_000, 1) == (True, 500)
        new = results["new"]
        assert not new.is_error
        assert new.meta == {CHARGED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 0, HELD_KEY: True}
        assert runs.n == 1
        assert await harness.balance(ALICE) == 0
        assert _books(tmp_path) == [("tip", 500, None, 500), ("charge", -500, KEY, 0)]
        # A later reissue under the new epoch replays; nothing more is charged.
        again = await _paid(harness, KEY, EPOCH_B)
        assert again == new
        assert runs.n == 1
        assert harness._pipeline.dropped == 1
    assert query(tmp_path, "SELECT call_key, atoms, state FROM calls") == [(KEY, 500, "done")]


@pytest.mark.parametrize(("first", "second"), [(EPOCH_A, EPOCH_A), (None, None), (None, EPOCH_B)])
async def test_the_same_epoch_or_none_changes_nothing(
    tmp_path: Path, first: str | None, second: str | None
) -> None:
    """Same epoch, or a held call without an epoch: a reissue of a held call
    waits for it and gets its outcome; one run, one charge, as before."""
    harness, runs = standard_harness(tmp_path, hold_seconds=30.0)
    async with harness:
        results: list[types.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def send(epoch: str | None) -> None:
                results.append(await _paid(harness, KEY, epoch))

            tg.start_soon(send, first)
            await until(lambda: harness.holds == 1)
            tg.start_soon(send, second)
            await until(lambda: waiting_on(harness, KEY) == 1)
            assert results == []
            await harness.credit(ALICE, 500)
        assert len(results) == 2
        assert results[0] == results[1]
        assert not results[0].is_error
        assert runs.n == 1
        assert harness.holds == 1
        assert harness._pipeline.dropped == 0
        assert await harness.balance(ALICE) == 0
    assert _books(tmp_path) == [("credit", 500, None, 500), ("charge", -500, KEY, 0)]


async def test_a_late_message_of_a_replaced_process_drops_nothing(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, hold_seconds=30.0)
    async with harness:
        results: dict[str, types.CallToolResult] = {}
        async with anyio.create_task_group() as tg:

            async def send(name: str, key: str, epoch: str) -> None:
                results[name] = await _paid(harness, key, epoch)

            tg.start_soon(send, "a", "1" * 32, EPOCH_A)
            await until(lambda: harness.holds == 1)
            tg.start_soon(send, "b", "2" * 32, EPOCH_B)
            await until(lambda: "a" in results and harness.holds == 2)
            assert _text(results["a"]) == DROPPED_TEXT
            # A's message arriving late: A is retired, so B's call stays held.
            assert harness._pipeline.observe_epoch(ALICE, EPOCH_A) == 0
            assert harness._pipeline.epochs.latest(ALICE) == EPOCH_B
            await harness.credit(ALICE, 500)
        assert not results["b"].is_error
        assert runs.n == 1
        assert await harness.balance(ALICE) == 0


async def test_a_held_call_in_the_middle_of_its_debit_is_not_dropped(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    pipeline = harness._pipeline
    held = pipeline.held
    claim, _ = harness._calls.claim(ALICE, KEY)
    charging = Hold(claim, EPOCH_A)
    charging.charging = True
    waiting = Hold(None, EPOCH_A)
    without = Hold(None, None)
    held._held[ALICE] = [charging, waiting, without]
    held._held[BOB] = [other := Hold(None, EPOCH_A)]
    assert pipeline.observe_epoch(ALICE, EPOCH_B) == 1
    assert (charging.dropped, waiting.dropped, without.dropped, other.dropped) == (False, True, False, False)
    # The in-flight debit keeps its claim: a retry waits for its outcome.
    assert harness._calls.claim(ALICE, KEY) == (claim, True)
    assert pipeline.observe_epoch(ALICE, None) == 0
    harness._accounts.close()


async def test_the_epoch_travels_in_params_meta(tmp_path: Path) -> None:
    """Over BR: the old session's held call ends dropped as soon as a call
    under a new epoch arrives, before that call claims the key."""
    harness, runs = standard_harness(tmp_path, hold_seconds=30.0)
    async with served(harness) as srv, srv.client(ALICE) as old, srv.client(ALICE) as new:
        results: dict[str, types.CallToolResult] = {}

        async def send(session: Any, name: str, epoch: Any) -> None:
            meta = {CALL_KEY: KEY, PAY_ALONGSIDE_KEY: 500, CALLER_EPOCH_KEY: epoch}
            request = types.CallToolRequest(
                params=types.CallToolRequestParams(name="paid", arguments={}, _meta=meta)  # type: ignore[arg-type]
            )
            results[name] = await session.send_request(request, types.CallToolResult)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, old, "old", EPOCH_A)
            await until(lambda: harness.holds == 1)
            # Malformed epochs are ignored: nothing is dropped.
            for bad in ("short", "x" * 129, 12345678, None):
                tg.start_soon(send, new, f"bad-{bad!r}", bad)
            await until(lambda: waiting_on(harness, KEY) == 4)
            assert harness._pipeline.dropped == 0
            tg.start_soon(send, new, "new", EPOCH_B)
            await until(lambda: "old" in results)
            assert _text(results["old"]) == DROPPED_TEXT
            await harness.credit(ALICE, 500)
        assert runs.n == 1
        # The malformed-epoch calls were duplicates of the held one: each got
        # the drop answer; the new epoch's call ran and was charged once.
        assert not results["new"].is_error
        assert [_text(r) for name, r in results.items() if name.startswith("bad-")] == [DROPPED_TEXT] * 4
        assert await harness.balance(ALICE) == 0


def test_caller_epoch_is_honoured_only_within_the_callkey_bounds() -> None:
    assert caller_epoch({CALLER_EPOCH_KEY: "e" * 8}) == "e" * 8
    assert caller_epoch({CALLER_EPOCH_KEY: "é" * 64}) == "é" * 64  # 128 UTF-8 bytes
    for bad in ("e" * 7, "é" * 65, 16, None, ["e" * 16]):
        assert caller_epoch({CALLER_EPOCH_KEY: bad}) is None
    assert caller_epoch(None) is None
    assert caller_epoch({}) is None


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 5)), max_size=200), st.integers(1, 6))
def test_caller_epochs_stay_bounded_and_know_the_latest(
    observations: list[tuple[int, int]], capacity: int
) -> None:
    """For any sequence of (caller, epoch) observations: at most
    ``capacity`` callers are remembered; a remembered caller's latest is
    the last news it sent; an epoch is news exactly when it is neither the
    caller's latest nor one it retired (a forgotten caller's is news)."""
    epochs = CallerEpochs(capacity=capacity, retired=3)
    model: dict[str, tuple[str, list[str]]] = {}
    order: list[str] = []
    for who, which in observations:
        peer, epoch = f"peer{who}", f"epoch-{which}-padded"
        known = model.get(peer)
        expected = known is None or (epoch != known[0] and epoch not in known[1][-3:])
        assert epochs.observe(peer, epoch) is expected
        if known is None:
            model[peer] = (epoch, [])
        elif expected:
            model[peer] = (epoch, [*known[1], known[0]])
        if peer in order:
            order.remove(peer)
        order.append(peer)
        while len(order) > capacity:
            model.pop(order.pop(0))
        assert len(epochs) == len(model) <= capacity
        for name, (latest, _) in model.items():
            assert epochs.latest(name) == latest


async def test_a_held_call_logs_its_hold_not_a_refusal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="brmcp")
    harness, runs = standard_harness(tmp_path, hold_seconds=30.0)
    async with harness:
        results: list[types.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def send() -> None:
                results.append(await _paid(harness, KEY, EPOCH_A))

            tg.start_soon(send)
            await until(lambda: harness.holds == 1)
            await harness.credit(ALICE, 500)
        assert not results[0].is_error
        assert runs.n == 1
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("holding call ") and "until the tip of 500 atoms sent alongside arrives" in m
        for m in lines
    )
    assert not any(m.startswith("payment required:") for m in lines), lines
    assert any(m.startswith(f"charged 500 atoms to {ALICE} for paid") for m in lines), lines
