"""The in-memory callKey registry (brmcp/server/calls/_callkeys.py; WIRE.md
§callKey): duplicates wait for and replay the original, refusals release
the key, outcomes expire after the window, memory stays bounded, and
retained outcomes cost the garbage collector nothing."""

from __future__ import annotations

import gc

import anyio
from mcp.types import CallToolResult, TextContent

from brmcp.server.calls import NOT_RETAINED_TEXT, CallKeyRegistry, error_result
from brmcp.server.catalog import to_result

PEER = "a" * 64


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def test_duplicates_wait_and_replay() -> None:
    registry = CallKeyRegistry(clock=lambda: 1000.0)
    original, duplicate = registry.claim(PEER, "key-00000001")
    assert not duplicate
    waiting, duplicate = registry.claim(PEER, "key-00000001")
    assert duplicate
    assert waiting is original
    outcome = to_result({"n": 1})
    replies: list[CallToolResult] = []
    async with anyio.create_task_group() as tg:

        async def wait() -> None:
            replies.append(await registry.wait(waiting))

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        registry.finish(original, outcome, 7)
    assert replies == [outcome]
    # A later duplicate is answered from the retained outcome.
    later, duplicate = registry.claim(PEER, "key-00000001")
    assert duplicate
    replay = await registry.wait(later)
    assert text(replay) == '{"n":1}'
    assert replay.structured_content == {"n": 1}
    assert not replay.is_error
    # Another peer's identical key is another call.
    assert registry.claim("b" * 64, "key-00000001")[1] is False


async def test_release_wakes_duplicates_with_the_originals_refusal() -> None:
    registry = CallKeyRegistry()
    original, _ = registry.claim(PEER, "key-00000002")
    waiting, _ = registry.claim(PEER, "key-00000002")
    refusal = error_result('{"error":"payment_required","price_atoms":5}')
    registry.release(original, "payment required", refusal)
    reply = await registry.wait(waiting)
    assert reply.model_dump() == refusal.model_dump()
    assert reply is not refusal  # a copy: the duplicate's answer is its own
    # The key is free again.
    assert registry.claim(PEER, "key-00000002")[1] is False


async def test_release_without_an_answer_wakes_duplicates_with_a_clear_error() -> None:
    registry = CallKeyRegistry()
    original, _ = registry.claim(PEER, "key-00000005")
    waiting, _ = registry.claim(PEER, "key-00000005")
    registry.release(original, "the original call was abandoned")
    reply = await registry.wait(waiting)
    assert reply.is_error
    assert "refused before running (the original call was abandoned)" in text(reply)
    assert registry.claim(PEER, "key-00000005")[1] is False


async def test_outcomes_expire_after_the_window() -> None:
    now = [1000.0]
    registry = CallKeyRegistry(window=60.0, clock=lambda: now[0])
    claim, _ = registry.claim(PEER, "key-00000003")
    registry.finish(claim, to_result({"n": 1}), 7)
    now[0] += 59.0
    assert registry.claim(PEER, "key-00000003")[1] is True
    now[0] += 2.0
    assert registry.claim(PEER, "key-00000003")[1] is False
    assert len(registry) == 1  # only the new in-flight claim


async def test_loaded_outcomes_and_not_retained_ones() -> None:
    registry = CallKeyRegistry(clock=lambda: 1000.0)
    registry.load(PEER, "key-00000004", to_result({"n": 4}), 2000.0, 0)
    registry.load(PEER, "key-00000005", None, 2000.0, 0)
    kept = await registry.wait(registry.claim(PEER, "key-00000004")[0])
    assert kept.structured_content == {"n": 4}
    dropped = await registry.wait(registry.claim(PEER, "key-00000005")[0])
    assert dropped.is_error
    assert text(dropped) == NOT_RETAINED_TEXT


async def test_memory_bound_drops_oldest_outcomes_but_keeps_keys() -> None:
    registry = CallKeyRegistry(clock=lambda: 1000.0, max_retained_bytes=1000)
    for i in range(5):
        claim, _ = registry.claim(PEER, f"key-{i:08d}")
        result = to_result("x" * 300)
        registry.finish(claim, result, 300)
    oldest, duplicate = registry.claim(PEER, "key-00000000")
    assert duplicate  # still claimed: it never runs twice
    reply = await registry.wait(oldest)
    assert reply.is_error
    assert text(reply) == "duplicate call: outcome no longer retained"
    newest = await registry.wait(registry.claim(PEER, "key-00000004")[0])
    assert text(newest) == "x" * 300


async def test_retained_outcomes_add_no_gc_tracked_objects() -> None:
    registry = CallKeyRegistry(clock=lambda: 1000.0)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(2000):
        claim, _ = registry.claim(PEER, f"key-{i:08d}")
        registry.finish(claim, to_result({"i": i, "text": "hello"}), 40)
    del claim
    gc.collect()
    grown = len(gc.get_objects()) - before
    # Kept as pydantic objects this would be ~10 per outcome (20,000 here).
    assert grown < 500, grown
    assert len(registry) == 2000


async def test_a_held_result_is_fetched_by_each_duplicate_until_it_is_finished() -> None:
    """An original whose completion could not be journaled holds its key:
    the duplicates waiting and the later ones each call the pending fetch
    (which says the result is still kept) until one finishes the claim;
    from then on every duplicate replays that result and the key never runs
    again."""
    registry = CallKeyRegistry(clock=lambda: 1000.0)
    original, _ = registry.claim(PEER, "key-00000009")
    waiting, duplicate = registry.claim(PEER, "key-00000009")
    assert duplicate
    kept = to_result({"n": 1})
    recorded = {"ok": False}
    fetches: list[str] = []

    async def fetch() -> CallToolResult:
        fetches.append("fetch")
        if not recorded["ok"]:
            return error_result("kept")
        registry.finish(original, kept, 10)
        return kept

    answers: list[CallToolResult] = []
    async with anyio.create_task_group() as tg:

        async def duplicate_call() -> None:
            answers.append(await registry.wait(waiting))

        tg.start_soon(duplicate_call)
        await anyio.wait_all_tasks_blocked()
        registry.hold(original, fetch)
    assert [text(a) for a in answers] == ["kept"]
    again, duplicate = registry.claim(PEER, "key-00000009")
    assert duplicate
    recorded["ok"] = True
    assert (await registry.wait(again)).structured_content == {"n": 1}
    replay, duplicate = registry.claim(PEER, "key-00000009")
    assert duplicate
    assert (await registry.wait(replay)).structured_content == {"n": 1}
    assert fetches == ["fetch", "fetch"]
