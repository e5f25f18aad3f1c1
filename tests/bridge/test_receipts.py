"""The bridge's receipt book (BRIDGE.md §Signed receipts): every signed
receipt a bot's result carries is kept with the checks it failed; a hostile
bot's receipt (bad signature, wrong atoms, another caller, other arguments,
a changed key) is recorded as such while the agent's call goes on
untouched and the money stays exact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp.bridge import cli
from brmcp.bridge.cli import receipt_line
from brmcp.bridge.daemon import write_runtime
from brmcp.bridge.find import (
    MAX_RECEIPTS_PER_BOT,
    RECEIPTS_FILE,
    ReceiptBook,
    ReceiptCall,
    StoredReceipt,
)
from brmcp.protocol.payment import CHARGED_ATOMS_KEY
from brmcp.protocol.receipts import SIGNED_RECEIPT_KEY, ReceiptSigner, args_sha256
from brmcp.testing import uid
from tests.kit import BOT, CLIENT, until
from tests.kit.bridge import Env, bridge_env, call

ARGS = {"text": "hi", "count": 2}


class Tampering(ReceiptSigner):
    """A hostile bot's signer: signs with some fields replaced, or breaks
    the signature (``break_sig``)."""

    def __init__(self, *, break_sig: bool = False, **override: Any) -> None:
        super().__init__(Ed25519PrivateKey.generate(), bot=BOT)
        self.override = override
        self.break_sig = break_sig

    def sign(self, **fields: Any) -> dict[str, str]:
        fields.update(self.override)
        signed = super().sign(**fields)
        if self.break_sig:
            signed["sig"] = ("0" if signed["sig"][0] != "0" else "1") + signed["sig"][1:]
        return signed


async def kept(env: Env, count: int) -> list[StoredReceipt]:
    """The book's receipts, newest first, once it holds ``count``."""

    async def enough() -> bool:
        return len(await anyio.to_thread.run_sync(env.bridge.receipts.list)) >= count

    await until(enough)
    return await anyio.to_thread.run_sync(env.bridge.receipts.list)


async def paid_call(env: Env) -> Any:
    async with env.session() as session:
        result = await call(session, "paid", ARGS)
    assert not result.is_error, result
    return result


async def test_a_good_receipt_is_kept_with_no_failed_check(tmp_path: Path) -> None:
    async with bridge_env(tmp_path, uid=CLIENT) as env:
        signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
        env.harness.config.receipt_signer = signer
        result = await paid_call(env)
        # The agent gets the bot's _meta as it is, receipt included.
        assert result.meta[CHARGED_ATOMS_KEY] == 500
        assert SIGNED_RECEIPT_KEY in result.meta
        (stored,) = await kept(env, 1)
        assert stored.checks == ()
        assert stored.bot == BOT
        assert stored.signed == result.meta[SIGNED_RECEIPT_KEY]
        assert stored.claims is not None
        assert (stored.claims.caller, stored.claims.atoms, stored.claims.pub) == (
            CLIENT,
            500,
            signer.public_hex,
        )
        assert stored.claims.args_sha256 == args_sha256(ARGS)
        assert stored.received_at == pytest.approx(env.clock.now(), abs=60)
        assert await anyio.to_thread.run_sync(env.bridge.receipts.pinned_key, BOT) == signer.public_hex
        assert await anyio.to_thread.run_sync(env.bridge.receipts.get, stored.receipt_id) == stored
        assert env.payer.calls == [(BOT, 500)]
        assert await env.harness.balance(CLIENT) == 0
        assert env.bridge.receipt_failures == 0


@pytest.mark.parametrize(
    ("signer", "failed"),
    [
        (Tampering(break_sig=True), ("signature",)),
        (Tampering(atoms=1), ("atoms",)),
        (Tampering(caller=uid(9)), ("caller",)),
        (Tampering(args_digest=args_sha256({"text": "other"})), ("argsSha256",)),
        (Tampering(call_key="k" * 32), ("callKey",)),
        (Tampering(atoms=0, caller=uid(9)), ("caller", "atoms")),
    ],
    ids=["signature", "atoms", "caller", "args", "callKey", "two"],
)
async def test_a_hostile_receipt_is_recorded_and_the_call_goes_on(
    tmp_path: Path, signer: Tampering, failed: tuple[str, ...]
) -> None:
    async with bridge_env(tmp_path, uid=CLIENT) as env:
        env.harness.config.receipt_signer = signer
        result = await paid_call(env)
        assert env.executions == {"paid": 1}
        (stored,) = await kept(env, 1)
        assert stored.checks == failed
        assert (stored.claims is None) == (failed == ("signature",))
        # The money is what it would have been without any receipt.
        assert env.payer.calls == [(BOT, 500)]
        assert await env.harness.balance(CLIENT) == 0
        assert result.meta[CHARGED_ATOMS_KEY] == 500


async def test_a_changed_key_is_recorded_against_the_pinned_one(tmp_path: Path) -> None:
    async with bridge_env(tmp_path, uid=CLIENT) as env:
        first = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
        env.harness.config.receipt_signer = first
        await paid_call(env)
        await kept(env, 1)
        env.harness.config.receipt_signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
        await paid_call(env)
        newest, oldest = await kept(env, 2)
        assert oldest.checks == ()
        # Pinned and announced (the tool list in force) are both the first key.
        assert newest.checks == ("keyChanged", "key")
        assert await anyio.to_thread.run_sync(env.bridge.receipts.pinned_key, BOT) == first.public_hex
        assert env.payer.calls == [(BOT, 500), (BOT, 500)]
        assert env.executions == {"paid": 2}


async def test_a_book_that_cannot_be_written_never_touches_the_call(tmp_path: Path) -> None:
    async with bridge_env(tmp_path, uid=CLIENT) as env:
        env.harness.config.receipt_signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
        env.bridge._receipts = ReceiptBook(tmp_path / "missing" / RECEIPTS_FILE)
        result = await paid_call(env)
        assert result.meta[CHARGED_ATOMS_KEY] == 500
        await until(lambda: env.bridge.receipt_failures == 1)
        assert env.payer.calls == [(BOT, 500)]


async def test_free_calls_and_unsigned_bots_leave_the_book_empty(tmp_path: Path) -> None:
    async with bridge_env(tmp_path, uid=CLIENT) as env:
        async with env.session() as session:
            assert not (await call(session, "paid", ARGS)).is_error
            assert not (await call(session, "free", {})).is_error
        # No receipt: the book's file is not even created.
        assert not (tmp_path / "bridge" / RECEIPTS_FILE).exists()
        assert env.bridge.receipt_failures == 0


async def test_admin_routes_cli_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with bridge_env(tmp_path, uid=CLIENT) as env:
        env.harness.config.receipt_signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
        await paid_call(env)
        env.harness.config.receipt_signer = Tampering(atoms=7)
        await paid_call(env)
        newest, oldest = await kept(env, 2)
        headers = {"Authorization": f"Bearer {env.bridge.admin_token}"}
        async with env.http(headers=headers) as http:
            listed = (await http.get(f"/admin/receipts?bot={BOT}&limit=5")).json()
            assert listed == {"receipts": [newest.to_dict(), oldest.to_dict()]}
            one = await http.get("/admin/receipts?limit=1")
            assert one.json() == {"receipts": [newest.to_dict()]}
            older = await http.get(f"/admin/receipts?before={newest.receipt_id}")
            assert older.json() == {"receipts": [oldest.to_dict()]}
            got = await http.get(f"/admin/receipts/{oldest.receipt_id}")
            assert got.status_code == 200
            assert got.json() == oldest.to_dict()
            assert (await http.get(f"/admin/receipts/{'0' * 64}")).status_code == 404
            for bad in ("?limit=0", "?limit=abc", "?limit=1001", "?bot=xyz", "/nothex", "?before=zz"):
                response = await http.get(f"/admin/receipts{bad}")
                assert response.status_code == 400, bad
                assert "error" in response.json()
            assert (await http.post("/admin/receipts", json={})).status_code == 405
            assert (await http.get(f"/admin/receipts?bot={uid(9)}")).json() == {"receipts": []}

        write_runtime(env.data_dir, listen=env.base_url[7:], url=env.base_url, sighup=False)
        datadir = str(env.data_dir)
        capsys.readouterr()
        assert await anyio.to_thread.run_sync(cli.main, ["--datadir", datadir, "receipts"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines == [receipt_line(newest.to_dict()), receipt_line(oldest.to_dict())]
        assert lines[0].endswith(
            f"{BOT[:8]}  paid  7 atoms  {newest.receipt_id[:12]}  failed: keyChanged, key, atoms"
        )
        assert lines[1].endswith(f"  paid  500 atoms  {oldest.receipt_id[:12]}  ok")
        argv = ["--datadir", datadir, "receipts", "--bot", BOT, "--limit", "1", "--json"]
        assert await anyio.to_thread.run_sync(cli.main, argv) == 0
        assert json.loads(capsys.readouterr().out) == {"receipts": [newest.to_dict()]}
        target = tmp_path / "export.jsonl"
        argv = ["--datadir", datadir, "receipts", "--export", str(target)]
        assert await anyio.to_thread.run_sync(cli.main, argv) == 0
        exported = [json.loads(line) for line in target.read_text().splitlines()]
        assert exported == [oldest.to_dict(), newest.to_dict()]
        assert set(exported[0]) == {"bot", "receiptId", "checks", "receivedAt", "receipt", "claims"}
        assert (
            await anyio.to_thread.run_sync(cli.main, ["--datadir", datadir, "receipts", "--limit", "0"]) == 1
        )
        assert "--limit 0" in capsys.readouterr().err
    # The daemon gone, the book file is read directly.
    (env.data_dir / "brmcp-bridge.runtime.json").unlink(missing_ok=True)
    assert cli.main(["--datadir", datadir, "receipts"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == lines
    assert "read from" in captured.err
    offline = tmp_path / "offline.jsonl"
    assert cli.main(["--datadir", datadir, "receipts", "--export", str(offline)]) == 0
    assert offline.read_text() == target.read_text()


# -- the book on its own ------------------------------------------------------------


def _call(signer: ReceiptSigner, **fields: Any) -> tuple[dict[str, str], ReceiptCall]:
    values: dict[str, Any] = {
        "call_id": "c" * 32,
        "caller": CLIENT,
        "tool": "paid",
        "args_digest": args_sha256({}),
        "call_key": "k" * 32,
        "atoms": 500,
        "time": 1_800_000_000,
    }
    values.update(fields)
    expected = ReceiptCall(
        announced=signer.public_hex, caller=CLIENT, args_digest=args_sha256({}), atoms=500, call_key="k" * 32
    )
    return signer.sign(**values), expected


def test_the_book_keeps_a_bounded_number_per_bot_and_each_receipt_once(tmp_path: Path) -> None:
    ticks = iter(range(1000))
    book = ReceiptBook(tmp_path / RECEIPTS_FILE, max_per_bot=3, clock=lambda: float(next(ticks)))
    signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
    ids = []
    for n in range(5):
        signed, expected = _call(signer, call_id=f"{n:032d}")
        stored = book.add(BOT, signed, expected)
        assert stored is not None
        assert stored.checks == ()
        ids.append(stored.receipt_id)
        again = book.add(BOT, signed, expected)  # a replay: the same receipt
        assert again == stored
    assert [s.receipt_id for s in book.list(BOT, 10)] == ids[:1:-1]
    assert book.get(ids[0]) is None
    other = ReceiptSigner(Ed25519PrivateKey.generate(), bot=uid(7))
    signed, expected = _call(other)
    assert book.add(uid(7), signed, expected) is not None
    assert len(book.list(None, 10)) == 4
    assert MAX_RECEIPTS_PER_BOT >= 1000
    book.close()


def test_an_oversize_receipt_is_refused_unstored(tmp_path: Path) -> None:
    book = ReceiptBook(tmp_path / RECEIPTS_FILE)
    signer = ReceiptSigner(Ed25519PrivateKey.generate())
    signed, expected = _call(signer)
    assert book.add(BOT, dict(signed, payload="A" * 10_000), expected) is None
    assert book.add(BOT, dict(signed, sig="0" * 1000), expected) is None
    assert book.list() == []
    book.close()


def test_the_first_announced_key_is_pinned_over_the_receipt_s(tmp_path: Path) -> None:
    book = ReceiptBook(tmp_path / RECEIPTS_FILE)
    announced = ReceiptSigner(Ed25519PrivateKey.generate())
    other = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
    signed, expected = _call(other)
    stored = book.add(BOT, signed, ReceiptCall(**{**_fields(expected), "announced": announced.public_hex}))
    assert stored is not None
    assert stored.checks == ("key",)
    assert book.pinned_key(BOT) == announced.public_hex
    signed, expected = _call(other, call_id="d" * 32)
    stored = book.add(BOT, signed, ReceiptCall(**{**_fields(expected), "announced": None}))
    assert stored is not None
    assert stored.checks == ("keyChanged",)
    book.close()


def test_a_receipt_naming_another_bot_fails_the_bot_check(tmp_path: Path) -> None:
    book = ReceiptBook(tmp_path / RECEIPTS_FILE)
    signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=uid(8))
    signed, expected = _call(signer)
    stored = book.add(BOT, signed, expected)
    assert stored is not None
    assert stored.checks == ("bot",)
    book.close()


def _fields(call: ReceiptCall) -> dict[str, Any]:
    return {
        "announced": call.announced,
        "caller": call.caller,
        "args_digest": call.args_digest,
        "atoms": call.atoms,
        "call_key": call.call_key,
    }


_TEXT = st.text(max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    signed=st.fixed_dictionaries({"payload": _TEXT, "sig": _TEXT, "pub": _TEXT}),
    mutate=st.sampled_from(["none", "payload", "sig", "pub"]),
)
def test_any_receipt_a_bot_sends_is_stored_with_its_checks_or_refused(
    tmp_path: Path, signed: dict[str, str], mutate: str
) -> None:
    book = ReceiptBook(tmp_path / "fuzz.sqlite3")
    signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
    good, expected = _call(signer)
    sent = good if mutate == "none" else dict(good, **{mutate: signed[mutate]})
    stored = book.add(BOT, sent, expected)
    assert stored is not None
    if sent == good:
        assert stored.checks == ()
    else:
        assert stored.checks == ("signature",)
        assert stored.claims is None
    assert book.get(stored.receipt_id) is not None
    book.close()
    (tmp_path / "fuzz.sqlite3").unlink()
    for extra in ("-wal", "-shm"):
        (tmp_path / f"fuzz.sqlite3{extra}").unlink(missing_ok=True)
