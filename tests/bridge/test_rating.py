"""Rating a bot at the directories with a signed receipt the bridge kept
(brmcp/bridge/find/_rating.py, ``brmcp-bridge rate`` in brmcp/bridge/cli/_ratecli.py;
BRIDGE.md §Signed receipts, docs/directory.md §Reputation): a provider that
signs receipts, listed by two real directories that crawled its key; an
agent's paid call through the bridge; the receipt kept; the rating taken
once per directory and refused the second time; receipts that failed a
check refused before any directory is asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brmcp.protocol.receipts import ReceiptSigner, verify_receipt
from tests.bridge.test_discovery import DIR_A, DIR_B, P1, STRANGER, World, _ok, bridge_settings, world
from tests.kit import until
from tests.kit.bridge import TOKEN


async def _paid_fortune(w: World, topic: str) -> dict[str, Any]:
    """An agent's paid ``fortune`` at P1 through the bridge; its result ``_meta``."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"{w.base_url}/mcp/{P1}", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await session.list_tools()
        result = await session.call_tool("fortune", {"topic": topic})
    assert not result.is_error, result
    assert result.meta is not None
    return dict(result.meta)


async def _admin(w: World, method: str, path: str, body: Any = None) -> httpx2.Response:
    async with w.admin_http() as http:
        return await http.request(method, path, json=body)


async def _listing(w: World, directory: str) -> dict[str, Any] | None:
    """``get_provider`` of P1 at ``directory``, asked by a stranger."""
    if not hasattr(w, "_reader"):
        w._reader = await w.stack.enter_async_context(w.fabric.router(STRANGER))  # type: ignore[attr-defined]
    answer: dict[str, Any] | None = await _ok(w._reader, directory, "get_provider", {"uid": P1})  # type: ignore[attr-defined]
    return answer


async def _kept(w: World, count: int) -> list[dict[str, Any]]:
    async def enough() -> bool:
        answer = await _admin(w, "GET", f"/admin/receipts?bot={P1}")
        return len(answer.json()["receipts"]) >= count

    await until(enough)
    receipts: list[dict[str, Any]] = (await _admin(w, "GET", f"/admin/receipts?bot={P1}")).json()["receipts"]
    return receipts


async def test_a_kept_receipt_rates_the_bot_once_at_each_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=P1)
    with anyio.fail_after(90):
        async with world(tmp_path, signers={P1: signer}, settings=bridge_settings(allowed_bots=(P1,))) as w:
            for directory in (DIR_A, DIR_B):
                listing = await _listing(w, directory)
                assert listing is not None
                assert listing.get("receiptKey") == signer.public_hex
            meta = await _paid_fortune(w, "stars")
            claims = verify_receipt(meta["brmcp/signedReceipt"], signer.public_hex)
            assert claims.atoms == meta["brmcp/chargedAtoms"] == 500
            (kept,) = await _kept(w, 1)
            assert kept["checks"] == []
            assert kept["receiptId"] == claims.receipt_id

            assert await w.cli("rate", claims.receipt_id[:12], "--stars", "4", "--comment", "quick") == 0
            out, _err = capsys.readouterr()
            assert f"directory {DIR_A}: rated: 4 stars for fortune (500 atoms)" in out
            assert f"directory {DIR_B}: rated" in out
            for directory in (DIR_A, DIR_B):
                listing = await _listing(w, directory)
                assert listing is not None
                reputation = listing["reputation"]
                assert (reputation["ratings"], reputation["ratedAtoms"], reputation["raters"]) == (1, 500, 1)

            # One rating per receipt: the same receipt again is refused by both.
            assert await w.cli("rate", claims.receipt_id, "--stars", "1") == 1
            _out, err = capsys.readouterr()
            assert err.count("already used") == 2
            assert "no directory took the rating" in err
            for directory in (DIR_A, DIR_B):
                listing = await _listing(w, directory)
                assert listing is not None
                assert listing["reputation"]["ratings"] == 1

            # A second paid call gives a second receipt, rated at one directory only.
            second = verify_receipt((await _paid_fortune(w, "more"))["brmcp/signedReceipt"])
            await _kept(w, 2)
            answer = await _admin(
                w, "POST", "/admin/rate", {"receipt": second.receipt_id, "stars": 5, "directory": DIR_B}
            )
            assert answer.status_code == 200, answer.text
            assert [(r["directory"], r["outcome"]) for r in answer.json()["results"]] == [(DIR_B, "rated")]
            b = await _listing(w, DIR_B)
            a = await _listing(w, DIR_A)
            assert b is not None
            assert a is not None
            assert (b["reputation"]["ratings"], a["reputation"]["ratings"]) == (2, 1)
            assert b["reputation"]["averageStars"] == 4.5


async def test_rate_refuses_bad_references_and_unverified_receipts_before_asking(tmp_path: Path) -> None:
    with anyio.fail_after(90):
        async with world(tmp_path, settings=bridge_settings(allowed_bots=(P1,))) as w:
            # P1 signs nothing here: a receipt it never sent cannot be named.
            for body, status, needle in (
                ({"receipt": "abc", "stars": 3}, 400, "at least 8 hex"),
                ({"receipt": "0" * 64, "stars": 3}, 404, "no receipt"),
                ({"receipt": "0" * 64, "stars": 3, "extra": 1}, 400, "unknown key 'extra'"),
                ({"receipt": 7, "stars": 3}, 400, "receipt must be"),
                ({"receipt": "0" * 64, "stars": 3, "comment": ["x"]}, 400, "comment must be"),
            ):
                answer = await _admin(w, "POST", "/admin/rate", body)
                assert answer.status_code == status, (body, answer.text)
                assert needle in answer.json()["error"]
            wrong = await _admin(w, "GET", "/admin/rate")
            assert wrong.status_code == 405

            # A receipt the bridge kept but that failed a check (another key
            # than the bot announced) is refused with the failed check named.
            forged = ReceiptSigner(Ed25519PrivateKey.generate(), bot=P1)
            signed = forged.sign(
                call_id="x",
                caller="c" * 64,
                tool="fortune",
                args_digest="0" * 64,
                call_key=None,
                atoms=500,
                time=1,
            )
            from brmcp.bridge.find import ReceiptCall

            stored = await anyio.to_thread.run_sync(
                lambda: w.bridge.receipts.add(
                    P1,
                    signed,
                    ReceiptCall(
                        announced="d" * 64, caller=None, args_digest="1" * 64, atoms=500, call_key=""
                    ),
                )
            )
            assert stored is not None
            assert stored.checks
            answer = await _admin(w, "POST", "/admin/rate", {"receipt": stored.receipt_id, "stars": 5})
            assert answer.status_code == 409
            assert "failed the bridge's checks" in answer.json()["error"]
            bad_stars = await _admin(w, "POST", "/admin/rate", {"receipt": stored.receipt_id, "stars": 9})
            assert bad_stars.status_code == 409  # the receipt is refused before the stars are read
            for directory in (DIR_A, DIR_B):
                listing = await _listing(w, directory)
                assert listing is not None
                assert listing["reputation"]["ratings"] == 0
            assert w.payer.calls == []
