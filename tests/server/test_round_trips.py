"""Harness features that save relay round trips: receipts on paid
results, both MCP eras over BR with the SDK, and the pay-alongside hold
(WIRE.md §Receipts, §Eras, §Pay alongside)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp_types.version import LATEST_MODERN_VERSION

from brmcp import ManualClock
from brmcp.protocol.payment import (
    BALANCE_ATOMS_KEY,
    CHARGED_ATOMS_KEY,
    PAY_ALONGSIDE_KEY,
    REFUNDED_ATOMS_KEY,
    REFUSAL_KEY,
    Receipt,
    parse_receipt,
    pay_alongside_atoms,
)
from brmcp.server.calls import HOLD_RECHECK
from brmcp.server.firstcontact import OFFER_LINGER
from tests.kit import until
from tests.kit.harness import (
    ALICE,
    BOB,
    BOT,
    Served,
    call,
    err_text,
    payment_required_json,
    served,
    standard_harness,
)
from tests.server.test_epoch import waiting_on


def _pms(srv: Served, peer: str = ALICE) -> int:
    return srv.fabric.link(peer, BOT).pms + srv.fabric.link(BOT, peer).pms


def _modern(conn_streams: tuple[Any, Any]) -> ClientSession:
    return ClientSession(*conn_streams, read_timeout_seconds=10)


def _adopt_modern(session: ClientSession) -> None:
    """Adopt 2026-07-28 without any wire traffic (what the bridge does)."""
    session.adopt(
        types.DiscoverResult(
            supported_versions=[LATEST_MODERN_VERSION],
            capabilities=types.ServerCapabilities(),
            result_type="complete",
            ttl_ms=0,
            cache_scope="public",
        )
    )


async def _raw_call(session: ClientSession, name: str, meta: dict[str, Any] | None) -> types.CallToolResult:
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(name=name, arguments={}, _meta=meta)  # type: ignore[arg-type]
    )
    return await session.send_request(request, types.CallToolResult)


# -- receipts ----------------------------------------------------------------------


async def test_paid_result_carries_receipt(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 1200)
        first = await call(s, "paid", key="k" * 16)
        assert not first.is_error
        assert parse_receipt(first.meta) == Receipt(charged_atoms=500, balance_atoms=700)
        wire = first.model_dump(by_alias=True, exclude_none=True)
        assert wire["_meta"] == {CHARGED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 700}
        second = await call(s, "paid")
        assert parse_receipt(second.meta) == Receipt(500, 200)
        # A duplicate replays the recorded outcome, receipt included; nothing is charged.
        again = await call(s, "paid", key="k" * 16)
        assert again.meta == first.meta
        assert await harness.balance(ALICE) == 200


async def test_no_receipt_on_free_refused_or_refunded(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        free = await call(s, "free", {"text": "x"})
        assert free.meta is None or CHARGED_ATOMS_KEY not in free.meta
        refused = await call(s, "paid")
        # The refusal's text stays byte-identical to the reference: one text,
        # no structuredContent; its only _meta is the genuine-refusal mark.
        assert err_text(refused) == payment_required_json("paid", 500, 0)
        assert refused.meta == {REFUSAL_KEY: True}
        assert refused.structured_content is None
        await harness.credit(ALICE, 500)
        failed = await call(s, "failing")
        assert failed.is_error
        assert parse_receipt(failed.meta) is None
        # A refund says so, with the balance after it.
        assert failed.meta == {REFUNDED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 500}
        assert await harness.balance(ALICE) == 500  # refunded


def test_parse_receipt_and_mark_values() -> None:
    assert parse_receipt({CHARGED_ATOMS_KEY: 5, BALANCE_ATOMS_KEY: 0}) == Receipt(5, 0)
    assert parse_receipt({CHARGED_ATOMS_KEY: 5.0, BALANCE_ATOMS_KEY: 7.0}) == Receipt(5, 7)
    for bad in (None, {}, {CHARGED_ATOMS_KEY: 5}, {CHARGED_ATOMS_KEY: True, BALANCE_ATOMS_KEY: 1}):
        assert parse_receipt(bad) is None
    assert parse_receipt({CHARGED_ATOMS_KEY: "5", BALANCE_ATOMS_KEY: 1}) is None
    assert parse_receipt({CHARGED_ATOMS_KEY: -1, BALANCE_ATOMS_KEY: 1}) is None
    assert pay_alongside_atoms({PAY_ALONGSIDE_KEY: 500}) == 500
    for bad_mark in (0, -3, True, "500", 1.5, None, 1 << 63):
        assert pay_alongside_atoms({PAY_ALONGSIDE_KEY: bad_mark}) == 0
    assert pay_alongside_atoms(None) == 0


# -- both eras over BR --------------------------------------------------------------


async def test_modern_era_over_br_one_round_trip_per_request(tmp_path: Path) -> None:
    """A 2026-07-28 client needs no initialize: its first request to the bot
    is answered in one round trip (2 PMs), payments and receipts work, and
    the handshake era keeps working beside it."""
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv:
        conn = srv.clients[ALICE].dial(BOT)
        async with _modern((conn.read_stream, conn.write_stream)) as s:
            _adopt_modern(s)
            before = _pms(srv)
            listed = await s.list_tools()
            assert _pms(srv) - before == 2
            by_name = {t.name: t for t in listed.tools}
            assert by_name["paid"].meta is not None
            assert by_name["paid"].meta["brmcp/priceAtoms"] == 500
            before = _pms(srv)
            refused = await _raw_call(s, "paid", {"brmcp/callKey": "m" * 32})
            assert _pms(srv) - before == 2
            assert err_text(refused) == payment_required_json("paid", 500, 0)
            await harness.credit(ALICE, 500)
            paid = await _raw_call(s, "paid", {"brmcp/callKey": "m" * 32})
            assert not paid.is_error
            assert parse_receipt(paid.meta) == Receipt(500, 0)
            assert runs.n == 1
            # The modern era's own probe is served too.
            found = types.DiscoverResult.model_validate(await s.send_discover(LATEST_MODERN_VERSION))
            assert found.capabilities.tools is not None
        async with srv.client(BOB) as legacy:
            assert (await legacy.list_tools()).tools
            assert not (await call(legacy, "free", {"text": "hi"})).is_error


async def test_handshake_bot_refuses_modern_request_without_initialize(tmp_path: Path) -> None:
    """The same sid cannot switch eras: after a handshake the modern
    envelope is refused (the bridge relies on the SDK's era lock)."""
    harness, _ = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        request = types.ListToolsRequest(
            params=types.PaginatedRequestParams(
                _meta={  # type: ignore[arg-type]
                    "io.modelcontextprotocol/protocolVersion": LATEST_MODERN_VERSION,
                    "io.modelcontextprotocol/clientInfo": {"name": "x", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            )
        )
        with pytest.raises(Exception, match="handshake"):
            await s.send_request(request, types.ListToolsResult)


# -- pay alongside ------------------------------------------------------------------


async def test_marked_call_is_held_until_the_credit(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, hold_seconds=10.0)
    async with served(harness) as srv, srv.client(ALICE) as s:
        results: list[types.CallToolResult] = []
        before = _pms(srv)
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                meta = {"brmcp/callKey": "h" * 32, PAY_ALONGSIDE_KEY: 500}
                results.append(await _raw_call(s, "paid", meta))

            tg.start_soon(go)
            await until(lambda: harness.holds > 0)
            assert not results
            assert runs.n == 0
            # The tip lands: a redelivered tip credits once and wakes the call once.
            assert await harness.record_tip(ALICE, 500_000, 77) == (True, 500)
        assert _pms(srv) - before == 2
        (result,) = results
        assert not result.is_error
        assert parse_receipt(result.meta) == Receipt(500, 0)
        # Held, then charged: the receipt counts the credit that released it.
        assert result.meta is not None
        assert result.meta["brmcp/held"] is True
        assert runs.n == 1
        assert await harness.balance(ALICE) == 0
        assert await harness.record_tip(ALICE, 500_000, 77) == (False, 0)
        # A marked call the credit already covers is charged at once: no held key.
        await harness.credit(ALICE, 500)
        at_once = await _raw_call(s, "paid", {"brmcp/callKey": "i" * 32, PAY_ALONGSIDE_KEY: 500})
        assert parse_receipt(at_once.meta) == Receipt(500, 0)
        assert at_once.meta is not None
        assert "brmcp/held" not in at_once.meta


async def test_hold_times_out_with_the_ordinary_refusal(tmp_path: Path) -> None:
    """The tip never comes: once ``hold_seconds`` passed on the harness's
    timer the held call gets the refusal it would have got at once."""
    clock = ManualClock()
    harness, runs = standard_harness(tmp_path, hold_seconds=30.0, timer=clock)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 100)
        results: list[types.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                meta = {PAY_ALONGSIDE_KEY: 400, "brmcp/callKey": "t" * 32}
                results.append(await _raw_call(s, "paid", meta))

            tg.start_soon(go)
            await until(lambda: clock.sleepers == 1)  # held: re-checking every HOLD_RECHECK
            assert harness.holds == 1
            assert clock.sleeps == [HOLD_RECHECK]
            clock.advance(30.0)
        (result,) = results
        assert err_text(result) == payment_required_json("paid", 500, 100)
        assert runs.n == 0
        assert await harness.balance(ALICE) == 100
        # The key was released: the reissue after a later top-up runs.
        await harness.credit(ALICE, 400)
        again = await _raw_call(s, "paid", {"brmcp/callKey": "t" * 32})
        assert not again.is_error
        assert runs.n == 1


async def test_hold_bounds_and_ignored_marks(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, hold_seconds=10.0, max_held_calls=1)
    async with served(harness) as srv, srv.client(ALICE) as s:
        # A tip too small to cover the price is not worth holding for.
        small = await _raw_call(s, "paid", {PAY_ALONGSIDE_KEY: 499})
        assert err_text(small) == payment_required_json("paid", 500, 0)
        # Malformed marks are ignored.
        for bad in ("500", True, -500, 0):
            bad_result = await _raw_call(s, "paid", {PAY_ALONGSIDE_KEY: bad})
            assert err_text(bad_result) == payment_required_json("paid", 500, 0)
        assert harness.holds == 0
        results: list[types.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def go(key: str) -> None:
                results.append(await _raw_call(s, "paid", {"brmcp/callKey": key, PAY_ALONGSIDE_KEY: 500}))

            tg.start_soon(go, "a" * 32)
            await until(lambda: harness.holds > 0)
            # Past the per-caller bound: refused at once, not held.
            over = await _raw_call(s, "paid", {"brmcp/callKey": "b" * 32, PAY_ALONGSIDE_KEY: 500})
            assert err_text(over) == payment_required_json("paid", 500, 0)
            assert harness.holds == 1
            assert not results
            await harness.credit(ALICE, 500)
        assert not results[0].is_error
        assert runs.n == 1


async def test_duplicate_of_a_held_call_waits_and_is_charged_once(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, hold_seconds=10.0)
    async with served(harness) as srv, srv.client(ALICE) as s:
        results: list[types.CallToolResult] = []
        meta = {"brmcp/callKey": "d" * 32, PAY_ALONGSIDE_KEY: 500}
        async with anyio.create_task_group() as tg:

            async def go() -> None:
                results.append(await _raw_call(s, "paid", meta))

            tg.start_soon(go)
            await until(lambda: harness.holds > 0)
            tg.start_soon(go)  # the bridge's reissue with the same key
            await until(lambda: waiting_on(harness, "d" * 32) == 1)
            await harness.credit(ALICE, 1000)
        assert len(results) == 2
        assert all(not r.is_error for r in results)
        assert runs.n == 1
        assert await harness.balance(ALICE) == 500
        metas = [json.loads(r.model_dump_json())["meta"] for r in results]
        assert metas[0] == metas[1]


# -- first contact in one round trip (WIRE.md §Eras) --------------------------------


async def _marked_initialize(session: ClientSession, meta: dict[str, Any] | None) -> types.InitializeResult:
    params = types.InitializeRequestParams(
        protocol_version="2025-11-25",
        capabilities=types.ClientCapabilities(),
        client_info=types.Implementation(name="probe", version="1"),
        _meta=meta,  # type: ignore[arg-type]
    )
    return await session.send_request(types.InitializeRequest(params=params), types.InitializeResult)


async def test_marked_initialize_brings_modern_versions_and_tools(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    harness.config.tool_visible = lambda peer, name: not (peer == BOB and name == "paid")
    async with served(harness) as srv:
        for peer, expected in ((ALICE, {"paid", "free", "failing"}), (BOB, {"free", "failing"})):
            conn = srv.clients[peer].dial(BOT)
            async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=10) as s:
                before = _pms(srv, peer)
                result = await _marked_initialize(s, {"brmcp/listTools": True})
                assert _pms(srv, peer) - before == 2
                assert result.meta is not None
                assert result.meta["brmcp/modernVersions"] == [LATEST_MODERN_VERSION]
                tools = types.ListToolsResult.model_validate(result.meta["brmcp/tools"]).tools
                # What tools/list answers this caller (visibility applies).
                assert {t.name for t in tools} >= expected - {"failing"}
                assert ("paid" in {t.name for t in tools}) == (peer == ALICE)
                paid = {t.name: t for t in tools}.get("paid")
                if paid is not None:
                    assert paid.meta is not None
                    assert paid.meta["brmcp/priceAtoms"] == 500
                # The handshake goes on as usual on the same session.
                s.adopt(result)
                await s.send_notification(types.InitializedNotification())
                listed = await s.list_tools()
                assert [t.name for t in listed.tools] == [t.name for t in tools]


async def test_plain_initialize_is_unchanged(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with served(harness) as srv:
        for meta in (None, {"brmcp/listTools": False}, {"brmcp/listTools": "yes"}, {"other": True}):
            conn = srv.clients[ALICE].dial(BOT)
            async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=10) as s:
                result = await _marked_initialize(s, meta)
                assert result.meta is None or not ({"brmcp/tools", "brmcp/modernVersions"} & set(result.meta))


async def test_abandoned_first_contact_session_is_closed(tmp_path: Path) -> None:
    """A client that went to the modern era elsewhere never sends
    initialized: the offered session is closed after OFFER_LINGER of
    silence (on the harness's timer, moved by hand here), so it holds no
    session slot; one that goes on is kept however long it stays quiet."""
    clock = ManualClock()
    harness, _ = standard_harness(tmp_path, timer=clock)
    async with served(harness) as srv:

        def sessions() -> int:
            return sum(1 for c in list(srv.router._sessions.values()) if c.peer == ALICE)

        conn = srv.clients[ALICE].dial(BOT)
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=10) as s:
            await _marked_initialize(s, {"brmcp/listTools": True})
            assert sessions() == 1
            await until(lambda: clock.sleepers == 1)  # the linger is timed
            clock.advance(OFFER_LINGER / 2)
            assert clock.sleepers == 1  # not yet due
            clock.advance(OFFER_LINGER / 2)
            await until(lambda: sessions() == 0)
        kept = srv.clients[ALICE].dial(BOT)
        async with ClientSession(kept.read_stream, kept.write_stream, read_timeout_seconds=10) as s:
            result = await _marked_initialize(s, {"brmcp/listTools": True})
            s.adopt(result)
            await s.send_notification(types.InitializedNotification())
            await s.list_tools()
            # The client spoke again: the linger ended without a close and
            # nothing waits on the timer any more, so no time can close it.
            await until(lambda: clock.sleepers == 0)
            clock.advance(10 * OFFER_LINGER)
            assert sessions() == 1
            assert not (await call(s, "free", {"text": "still here"})).is_error
