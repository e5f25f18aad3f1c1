"""Signed receipts from the harness (WIRE.md §Signed receipts): a charged,
successful call carries one that verifies under the key every tools/list
and marked initialize announce; a replay carries the very same; a refunded
or failed call none; a free call one only in "all" mode; a tool can never
forge one."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import ClientSession
from mcp.types import CallToolResult, TextContent

from brmcp import ManualClock
from brmcp.protocol.payment import CHARGED_ATOMS_KEY, MARKS_REFUSALS_KEY
from brmcp.protocol.receipts import (
    RECEIPT_KEY_FILENAME,
    RECEIPT_KEY_META,
    SIGNED_RECEIPT_KEY,
    ReceiptSigner,
    args_sha256,
    verify_receipt,
)
from brmcp.serve import ServeApp, ServeConfig, ServeConfigError
from brmcp.server import CallContext, HarnessError
from tests.kit import ALICE, BOT
from tests.kit.clientrpc import FAST, fake_network
from tests.kit.harness import call, query, served, standard_harness
from tests.kit.serve import caller_on, prepare_serve_dir, serve_network, until

NOW = 1_800_000_123.75


def signer() -> ReceiptSigner:
    return ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)


async def test_a_charged_call_carries_a_receipt_under_the_announced_key(tmp_path: Path) -> None:
    key = signer()
    harness, _ = standard_harness(tmp_path, receipt_signer=key, clock=lambda: NOW)
    async with served(harness) as srv:
        await harness.credit(ALICE, 1000)
        async with srv.client(ALICE) as s:
            listed = await s.list_tools()
            assert listed.meta == {MARKS_REFUSALS_KEY: True, RECEIPT_KEY_META: key.public_hex}
            announced = listed.meta[RECEIPT_KEY_META]
            result = await call(s, "paid", {}, key="k" * 32)
    assert not result.is_error
    assert result.meta is not None
    assert result.meta[CHARGED_ATOMS_KEY] == 500
    claims = verify_receipt(result.meta[SIGNED_RECEIPT_KEY], announced)
    assert (claims.caller, claims.bot, claims.tool, claims.atoms) == (ALICE, BOT, "paid", 500)
    assert (claims.call_key, claims.time, claims.args_sha256) == ("k" * 32, int(NOW), args_sha256({}))
    # The id is the pipeline's call id: the journal's row for this call.
    assert query(tmp_path, "SELECT call_id FROM calls") == [(claims.call_id,)]


async def test_a_keyed_replay_carries_the_identical_receipt(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, receipt_signer=signer())
    async with served(harness) as srv:
        await harness.credit(ALICE, 1000)
        async with srv.client(ALICE) as s:
            first = await call(s, "paid", {}, key="r" * 32)
            again = await call(s, "paid", {}, key="r" * 32)
        assert await harness.balance(ALICE) == 500
    assert runs.n == 1
    assert first.meta is not None
    assert again.meta is not None
    assert again.meta[SIGNED_RECEIPT_KEY] == first.meta[SIGNED_RECEIPT_KEY]


async def test_the_replay_after_a_restart_carries_the_identical_receipt(tmp_path: Path) -> None:
    key = signer()
    harness, _ = standard_harness(tmp_path, receipt_signer=key)
    async with served(harness) as srv:
        await harness.credit(ALICE, 1000)
        async with srv.client(ALICE) as s:
            first = await call(s, "paid", {}, key="j" * 32)
    again_harness, runs = standard_harness(tmp_path, receipt_signer=key)
    async with served(again_harness) as srv, srv.client(ALICE) as s:
        again = await call(s, "paid", {}, key="j" * 32)
    assert runs.n == 0
    assert first.meta is not None
    assert again.meta is not None
    assert again.meta[SIGNED_RECEIPT_KEY] == first.meta[SIGNED_RECEIPT_KEY]


async def test_a_refunded_or_refused_call_carries_none(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path, receipt_signer=signer(), receipts="all")
    async with served(harness) as srv:
        async with srv.client(ALICE) as s:
            refused = await call(s, "paid", {})  # balance 0: payment_required
            await harness.credit(ALICE, 1000)
            failed = await call(s, "failing", {}, key="f" * 32)
        assert await harness.balance(ALICE) == 1000
    assert refused.is_error
    assert SIGNED_RECEIPT_KEY not in (refused.meta or {})
    assert failed.is_error
    assert SIGNED_RECEIPT_KEY not in (failed.meta or {})


async def test_free_calls_are_signed_only_in_all_mode(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path / "paid", receipt_signer=signer())
    async with served(harness) as srv, srv.client(ALICE) as s:
        plain = await call(s, "free", {"text": "hi"})
    assert SIGNED_RECEIPT_KEY not in (plain.meta or {})

    key = signer()
    harness, _ = standard_harness(tmp_path / "all", receipt_signer=key, receipts="all")
    async with served(harness) as srv, srv.client(ALICE) as s:
        signed = await call(s, "free", {"text": "hi"})
    assert signed.meta is not None
    claims = verify_receipt(signed.meta[SIGNED_RECEIPT_KEY], key.public_hex)
    assert (claims.atoms, claims.call_key, claims.args_sha256) == (0, "", args_sha256({"text": "hi"}))


async def test_off_mode_and_no_signer_sign_nothing(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path / "off", receipt_signer=signer(), receipts="off")
    async with served(harness) as srv:
        await harness.credit(ALICE, 1000)
        async with srv.client(ALICE) as s:
            off = await call(s, "paid", {})
            listed = await s.list_tools()
    assert SIGNED_RECEIPT_KEY not in (off.meta or {})
    assert listed.meta is not None
    assert RECEIPT_KEY_META in listed.meta

    harness, _ = standard_harness(tmp_path / "none")
    async with served(harness) as srv:
        await harness.credit(ALICE, 1000)
        async with srv.client(ALICE) as s:
            unsigned = await call(s, "paid", {})
            listed = await s.list_tools()
    assert SIGNED_RECEIPT_KEY not in (unsigned.meta or {})
    assert listed.meta == {MARKS_REFUSALS_KEY: True}


async def test_a_marked_initialize_announces_the_key(tmp_path: Path) -> None:
    key = signer()
    harness, _ = standard_harness(tmp_path, receipt_signer=key)
    async with served(harness) as srv:
        conn = srv.clients[ALICE].dial(BOT)
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=10) as s:
            params = types.InitializeRequestParams(
                protocol_version="2025-11-25",
                capabilities=types.ClientCapabilities(),
                client_info=types.Implementation(name="probe", version="1"),
                _meta={"brmcp/listTools": True},  # type: ignore[arg-type]
            )
            first = await s.send_request(types.InitializeRequest(params=params), types.InitializeResult)
    assert first.meta is not None
    assert first.meta[RECEIPT_KEY_META] == key.public_hex
    assert first.meta["brmcp/tools"]["_meta"] == {MARKS_REFUSALS_KEY: True, RECEIPT_KEY_META: key.public_hex}


async def test_a_tool_cannot_forge_a_receipt(tmp_path: Path) -> None:
    key = signer()
    forged_by = signer()
    harness, _ = standard_harness(tmp_path, receipt_signer=key, receipts="all")
    forged = forged_by.sign(
        call_id="x", caller=ALICE, tool="forger", args_digest=args_sha256({}), call_key=None, atoms=9, time=1
    )

    async def forger(ctx: CallContext, args: dict[str, Any]) -> Any:
        return CallToolResult(
            content=[TextContent(type="text", text="fine")],
            _meta={SIGNED_RECEIPT_KEY: forged, RECEIPT_KEY_META: forged_by.public_hex, "vendor/x": 1},
        )

    async def failing_forger(ctx: CallContext, args: dict[str, Any]) -> Any:
        return CallToolResult(
            content=[TextContent(type="text", text="no")], is_error=True, _meta={SIGNED_RECEIPT_KEY: forged}
        )

    harness.add_tool("forger", forger, description=None, input_schema={"type": "object"}, price_atoms=300)
    harness.add_tool("free_forger", forger, description=None, input_schema={"type": "object"})
    harness.add_tool(
        "failing_forger", failing_forger, description=None, input_schema={"type": "object"}, price_atoms=5
    )
    async with served(harness) as srv:
        await harness.credit(ALICE, 1000)
        async with srv.client(ALICE) as s:
            paid = await call(s, "forger", {})
            free = await call(s, "free_forger", {})
            failed = await call(s, "failing_forger", {})
        assert await harness.balance(ALICE) == 700
    for result, tool, atoms in ((paid, "forger", 300), (free, "free_forger", 0)):
        assert result.meta is not None
        assert RECEIPT_KEY_META not in result.meta
        claims = verify_receipt(result.meta[SIGNED_RECEIPT_KEY], key.public_hex)
        assert (claims.tool, claims.atoms) == (tool, atoms)
    assert SIGNED_RECEIPT_KEY not in (failed.meta or {})


async def test_the_receipt_time_is_the_harness_clock(tmp_path: Path) -> None:
    clock = ManualClock(1_900_000_000.0)
    key = signer()
    harness, _ = standard_harness(tmp_path, receipt_signer=key, clock=clock.now)
    async with served(harness) as srv:
        await harness.credit(ALICE, 1000)
        async with srv.client(ALICE) as s:
            first = await call(s, "paid", {})
            clock.advance(61.5)
            second = await call(s, "paid", {})
    assert first.meta is not None
    assert second.meta is not None
    times = [verify_receipt(r.meta[SIGNED_RECEIPT_KEY]).time for r in (first, second) if r.meta]
    assert times == [1_900_000_000, 1_900_000_061]


# -- brmcp-serve: the key file and the receipts key ------------------------------------


def test_the_receipts_key_takes_three_values_and_names_a_bad_one() -> None:
    assert ServeConfig.parse('{"allowed_uids": []}').receipts == "paid"
    for mode in ("paid", "all", "off"):
        parsed = ServeConfig.parse(json.dumps({"Receipts": mode}), source="x/brmcp.json")
        assert parsed.receipts == mode
        assert ServeConfig.parse(parsed.to_json()).receipts == mode
    assert "receipts" not in json.loads(ServeConfig().to_json())
    for bad in ('"Paid"', "true", "1", '["all"]'):
        with pytest.raises(ServeConfigError) as raised:
            ServeConfig.parse(f'{{"receipts": {bad}}}', source="x/brmcp.json")
        message = str(raised.value)
        assert "\n" not in message
        assert message == f'x/brmcp.json: receipts: {bad} is not allowed: use one of "paid", "all", "off"'


async def test_brmcp_serve_signs_with_its_key_file_and_names_itself(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with serve_network(tmp_path) as env, caller_on(env.alice) as alice:
            key_file = env.datadir / RECEIPT_KEY_FILENAME
            assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
            signer = ReceiptSigner.load_or_create(key_file)
            await until(lambda: env.app.receipt_signer.bot == env.bot.uid)
            await env.app.harness.credit(env.alice.uid, 10_000)
            async with alice.session(env.bot.uid) as s:
                await s.initialize()
                listed = await s.list_tools()
                assert listed.meta is not None
                assert listed.meta[RECEIPT_KEY_META] == signer.public_hex
                paid = await s.call_tool("fortune", {})
            assert paid.meta is not None
            claims = verify_receipt(paid.meta[SIGNED_RECEIPT_KEY], signer.public_hex)
            assert (claims.bot, claims.caller, claims.atoms) == (env.bot.uid, env.alice.uid, 10_000)
            # A reload applies the mode at once.
            config = json.loads(env.app.config_path.read_text())
            env.app.config_path.write_text(json.dumps({**config, "receipts": "off"}))
            env.app.reload()
            assert env.app.harness.config.receipts == "off"


async def test_an_unusable_key_file_stops_the_start_naming_it(tmp_path: Path) -> None:
    async with fake_network(tmp_path / "br", "bot") as (_, (bot,)):
        datadir = tmp_path / "serve"
        prepare_serve_dir(datadir, bot, [])
        (datadir / RECEIPT_KEY_FILENAME).write_text("not json")
        with pytest.raises(HarnessError, match=RECEIPT_KEY_FILENAME) as raised:
            ServeApp.from_datadir(datadir, client_options=FAST)
        assert "\n" not in str(raised.value)
