"""The Go reference's directory (``brmcp-goref directory``) on the fabric,
with providers and clients of ours and of the reference's.

One listing end to end against a Python provider harness: ``register``
answers the funding invoice, a tip funds it, the directory crawls the
provider and pays for its nominated test call (the payment is settled by
crediting the provider's ledger), the registration waits for review, the
admin approves it and ``search`` / ``get_provider`` / ``list_categories`` /
``get_snapshot`` answer. The answers are pinned exactly as the reference
gives them (the text content is the compact JSON of ``structuredContent``;
errors are ``isError`` results whose only text is the message), and the
books are checked to the atom. A second test runs the reference's own
provider (``Registrant`` under an AutoFund policy) against the directory;
a third federates two reference directories (``add_peer``,
``verify_peer`` buying the peer's snapshot, a lead, ``pursue_lead``, the
provider registering at the second directory).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from brmcp.directory.provider import INVITE_SCHEMA
from brmcp.server import Harness, HarnessConfig
from brmcp.testing import Fabric
from brmcp.transport import Router
from tests.kit import until

from .godir import (
    ADMIN,
    DIRECTORY,
    PEER_DIRECTORY,
    PROVIDER,
    GoDirectory,
    add_probe_tools,
    go_autofund_provider,
    go_directory,
    go_directory_pair,
)
from .live import Tap

pytestmark = pytest.mark.interop

START = 1_800_000_000
FEE = 50_000
TEST_PRICE = 5_000
TEST_MAX = 20_000
SNAPSHOT_PRICE = 10_000
EXPIRES = START + 30 * 86_400
POLICY = {"admin_uids": [ADMIN], "listing_fee_atoms": FEE, "name": "interop-dir"}
REGISTRATION = {
    "description": "An interop provider",
    "tags": ["Test", "interop", "test"],
    "test": {"tool": "test", "args": {"text": "probe"}, "maxAtoms": TEST_MAX},
}
ADMIN_TOOLS = {
    "approve",
    "add_peer",
    "flag",
    "leads",
    "pending_registrations",
    "pursue_lead",
    "recrawl",
    "reject",
    "remove_peer",
    "run_verification",
    "stats",
    "unlist",
    "verify_peer",
}
PUBLIC_TOOLS = {
    "get_provider",
    "get_snapshot",
    "introduce",
    "list_categories",
    "my_status",
    "policy",
    "register",
    "search",
}


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _shape(schema: Any) -> Any:
    """A JSON schema without its ``description`` texts (wording may differ)."""
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items() if k not in {"description", "$schema"}}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


def ok(result: CallToolResult) -> dict[str, Any]:
    """A successful answer's ``structuredContent``, after checking the
    reference's shape: one text content carrying the same object as
    compact JSON."""
    assert not result.is_error, result
    assert len(result.content) == 1
    text = result.content[0]
    assert isinstance(text, TextContent)
    assert result.structured_content is not None
    assert json.loads(text.text) == result.structured_content
    assert text.text == _compact(result.structured_content)
    out: dict[str, Any] = result.structured_content
    return out


def err(result: CallToolResult) -> str:
    """An error answer's message: ``isError`` with one text content and
    no ``structuredContent``."""
    assert result.is_error
    assert result.structured_content is None
    assert len(result.content) == 1
    text = result.content[0]
    assert isinstance(text, TextContent)
    return text.text


def raw_answer(tap: Tap, caller: str, tool: str) -> str:
    """The exact ``result`` bytes of the directory's last answer to a
    ``tool`` call from ``caller`` (JSON-RPC framing stripped)."""
    asks = [
        m
        for m in tap.json(caller, DIRECTORY)
        if m.get("method") == "tools/call" and m["params"]["name"] == tool
    ]
    want = asks[-1]["id"]
    for payload, _ in tap.messages(DIRECTORY, caller):
        text = payload.decode()
        message = json.loads(text)
        if message.get("id") == want and "method" not in message:
            prefix = f'{{"jsonrpc":"2.0","id":{want},"result":'
            assert text.startswith(prefix)
            assert text.endswith("}")
            return text[len(prefix) : -1]
    raise AssertionError(f"no answer to {tool} from {caller[:8]}")


@asynccontextmanager
async def session(router: Router, peer: str) -> AsyncIterator[ClientSession]:
    """A stock SDK client session dialed from ``router`` to ``peer``."""
    conn = router.dial(peer)
    async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=30) as s:
        await s.initialize()
        yield s


async def status(s: ClientSession) -> dict[str, Any]:
    return ok(await s.call_tool("my_status", {}))


def py_provider(data_dir: Path, runs: list[dict[str, Any]]) -> Harness:
    """Our harness at PROVIDER: the priced ``test`` tool (TEST_PRICE atoms)
    and a free ``echo``, callable by the directory only."""
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            allowed_peers={DIRECTORY},
            calls_per_minute=100_000,
            name="interop-provider",
        )
    )
    add_probe_tools(harness, runs, price_atoms=TEST_PRICE)
    return harness


async def wait_state(d: GoDirectory, uid: str, state: str) -> dict[str, Any]:
    """Wait until ``uid``'s registration in the directory's index is in
    ``state``; returns the index entry."""
    entry: dict[str, Any] = {}

    async def reached() -> bool:
        index = (await d.state())["index"] or {}
        entry.update(index.get(uid, {}))
        return bool(entry.get("reg", {}).get("state") == state)

    await until(reached, limit=60)
    return entry


async def test_listing_against_a_python_provider(tmp_path: Path, goref_binary: Path) -> None:
    runs: list[dict[str, Any]] = []
    provider = py_provider(tmp_path / "provider", runs)

    async def pay(payee: str, atoms: int) -> None:
        # The directory's tip lands in the payee's ledger.
        assert payee == PROVIDER
        await provider.credit(DIRECTORY, atoms)

    async with Fabric() as fabric:
        tap = Tap()
        fabric.add_tap(tap)
        async with provider.serve(fabric.sender(PROVIDER)) as router:
            fabric.attach(PROVIDER, router.handle_pm)
            async with (
                go_directory(
                    fabric, goref_binary, tmp_path / "dir", POLICY, pay=pay, args=["-now", str(START)]
                ) as d,
                session(router, DIRECTORY) as p,
                fabric.router(ADMIN) as admin_router,
            ):
                # The public face, as the provider sees it.
                listed = {t.name: t for t in (await p.list_tools()).tools}
                assert set(listed) == PUBLIC_TOOLS
                assert listed["get_snapshot"].meta == {"brmcp/priceAtoms": SNAPSHOT_PRICE}
                assert listed["search"].meta == {"brmcp/priceAtoms": 0}
                assert await status(p) == {"state": "none"}
                assert raw_answer(tap, PROVIDER, "my_status") == (
                    '{"content":[{"type":"text","text":"{\\"state\\":\\"none\\"}"}],"structuredContent":{"state":"none"}}'
                )
                assert ok(await p.call_tool("policy", {})) == {
                    "name": "interop-dir",
                    "listingFeeAtoms": FEE,
                    "snapshotPriceAtoms": SNAPSHOT_PRICE,
                    "searchPriceAtoms": 0,
                    "testBudgetMaxAtoms": 10_000_000,
                    "expiryDays": 30,
                    "pubKey": d.pub_key,
                }

                # Refusals: the SDK's schema check, then the handler's own.
                assert err(await p.call_tool("register", {"description": "x"})) == (
                    'validating "arguments": validating root: required: missing properties: ["test"]'
                )
                assert raw_answer(tap, PROVIDER, "register") == (
                    '{"content":[{"type":"text","text":"validating \\"arguments\\": validating root: '
                    'required: missing properties: [\\"test\\"]"}],"isError":true}'
                )
                zero = {**REGISTRATION, "test": {"tool": "test", "maxAtoms": 0}}
                assert err(await p.call_tool("register", zero)) == "test.maxAtoms must be positive"
                over = {**REGISTRATION, "test": {"tool": "test", "maxAtoms": 10_000_001}}
                assert err(await p.call_tool("register", over)) == (
                    "test.maxAtoms exceeds the directory's 10000000 atom ceiling"
                )
                assert err(await p.call_tool("register", {**REGISTRATION, "description": "  "})) == (
                    "description is required"
                )
                assert await status(p) == {"state": "none"}

                # The invoice, then the tip that funds it (the fee is taken at once).
                invoice = ok(await p.call_tool("register", REGISTRATION))
                assert invoice == {
                    "state": "awaiting_funding",
                    "requiredAtoms": FEE + TEST_MAX,
                    "shortfallAtoms": FEE + TEST_MAX,
                    "feeAtoms": FEE,
                    "testBudgetAtoms": TEST_MAX,
                }
                assert await d.credit_tip(PROVIDER, 1_000) == 1_000
                assert await status(p) == {
                    **invoice,
                    "balanceAtoms": 1_000,
                    "shortfallAtoms": FEE + TEST_MAX - 1_000,
                }
                assert await d.credit_tip(PROVIDER, FEE + TEST_MAX - 1_000) == TEST_MAX

                # Crawl, the paid test call, then the review queue.
                entry = await wait_state(d, PROVIDER, "pending_review")
                reg = entry["reg"]
                assert reg["testOutcome"] == "ok"
                assert reg["paidAtoms"] == TEST_PRICE
                assert reg["tags"] == ["test", "interop"]
                assert [t["name"] for t in reg["catalog"]] == ["test", "echo"]
                assert reg["catalog"][0] == {
                    "_meta": {"brmcp/priceAtoms": TEST_PRICE},
                    "description": "A priced verification probe.",
                    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
                    "name": "test",
                }
                assert await status(p) == {
                    "state": "pending_review",
                    "feeAtoms": FEE,
                    "testBudgetAtoms": TEST_MAX,
                }
                assert runs == [{"text": "probe"}]
                assert d.payments == [(PROVIDER, TEST_PRICE)]
                assert await provider.balance(DIRECTORY) == 0

                async with session(admin_router, DIRECTORY) as a:
                    admin_listed = {t.name for t in (await a.list_tools()).tools}
                    assert admin_listed == PUBLIC_TOOLS | ADMIN_TOOLS
                    # Hidden from everyone else: a JSON-RPC error, not a tool error.
                    with pytest.raises(MCPError) as hidden:
                        await p.call_tool("approve", {"uid": PROVIDER})
                    assert (hidden.value.code, hidden.value.message) == (-32602, 'unknown tool "approve"')
                    queue = ok(await a.call_tool("pending_registrations", {}))
                    assert queue == {
                        "registrations": [
                            {
                                "uid": PROVIDER,
                                "state": "pending_review",
                                "description": REGISTRATION["description"],
                                "tags": ["test", "interop"],
                                "test": REGISTRATION["test"],
                                "renewal": False,
                                "testOutcome": "ok",
                                "feeAtoms": FEE,
                                "budgetAtoms": TEST_MAX,
                                "paidAtoms": TEST_PRICE,
                                "createdAt": START,
                            }
                        ]
                    }
                    assert ok(await a.call_tool("approve", {"uid": PROVIDER})) == {
                        "state": "listed",
                        "expiresAt": EXPIRES,
                    }
                    assert err(await a.call_tool("approve", {"uid": PROVIDER})) == (
                        "nothing pending review for that uid"
                    )
                    assert await status(p) == {"state": "listed", "expiresAt": EXPIRES}

                    # What a searcher gets.
                    hits = ok(await a.call_tool("search", {"query": "PROBE"}))
                    assert hits == {
                        "hits": [
                            {
                                "providerUid": PROVIDER,
                                "tool": "test",
                                "description": "A priced verification probe.",
                                "priceAtoms": TEST_PRICE,
                                "tags": ["test", "interop"],
                                "catalogCheckedAt": START,
                                "lastVerifiedExecution": START,
                            }
                        ],
                        "total": 1,
                    }
                    # A price ceiling keeps free tools; query tags are normalized too.
                    cheap = ok(await a.call_tool("search", {"maxPriceAtoms": 1}))
                    assert [h["tool"] for h in cheap["hits"]] == ["echo"]
                    assert "priceAtoms" not in cheap["hits"][0]
                    by_tag = ok(await a.call_tool("search", {"tags": [" INTEROP "]}))
                    assert [h["tool"] for h in by_tag["hits"]] == ["test", "echo"]
                    assert ok(await a.call_tool("search", {"tags": ["interop", "other"]})) == {
                        "hits": [],
                        "total": 0,
                    }
                    listing = ok(await a.call_tool("get_provider", {"uid": PROVIDER}))
                    assert listing == {
                        "uid": PROVIDER,
                        "description": REGISTRATION["description"],
                        "tags": ["test", "interop"],
                        "catalog": reg["catalog"],
                        "catalogCheckedAt": START,
                        "lastVerifiedExecution": START,
                        "testLatencyMs": 0,
                        "approvedAt": START,
                        "expiresAt": EXPIRES,
                    }
                    assert err(await a.call_tool("get_provider", {"uid": ADMIN})) == "no listing for that uid"
                    assert raw_answer(tap, ADMIN, "get_provider") == (
                        '{"content":[{"type":"text","text":"no listing for that uid"}],"isError":true}'
                    )
                    assert ok(await a.call_tool("list_categories", {})) == {"tags": {"interop": 1, "test": 1}}

                    # Introductions go through the Suggester.
                    assert ok(await a.call_tool("introduce", {"uid": PROVIDER})) == {
                        "suggested": True,
                        "note": "accept the KX suggestion in your client to complete the exchange",
                    }
                    assert d.suggestions == [(ADMIN, PROVIDER)]
                    assert err(await a.call_tool("introduce", {"uid": ADMIN})) == (
                        "cannot introduce a caller to itself"
                    )
                    await d.notify_kx(PROVIDER)

                    # The snapshot is priced: refused, tipped for, bought.
                    refusal = err(await a.call_tool("get_snapshot", {}))
                    assert refusal == (
                        '{"error":"payment_required","tool":"get_snapshot","priceAtoms":10000,'
                        '"balanceAtoms":0,"shortfallAtoms":10000,"acceptedRails":["tip"]}'
                    )
                    assert await d.credit_tip(ADMIN, SNAPSHOT_PRICE) == SNAPSHOT_PRICE
                    signed = ok(await a.call_tool("get_snapshot", {}))
                    assert set(signed) == {"payload", "sig", "pub"}
                    assert signed["pub"] == d.pub_key
                    verified = await go_verify(goref_binary, signed, d.pub_key)
                    assert verified["ok"] is True
                    assert verified["snapshot"] == {
                        "v": 1,
                        "generatedAt": START,
                        "listings": [
                            {
                                "uid": PROVIDER,
                                "description": REGISTRATION["description"],
                                "tags": ["test", "interop"],
                                "catalog": reg["catalog"],
                                "catalogCheckedAt": START,
                                "lastVerifiedExecution": START,
                                "expiresAt": EXPIRES,
                            }
                        ],
                    }

                    assert ok(await a.call_tool("stats", {})) == {
                        "live": 1,
                        "inPipeline": 0,
                        "pendingReview": 0,
                        "leads": 0,
                        "peers": 0,
                        "spendEntries": 1,
                        "spendAtoms": TEST_PRICE,
                    }

                # The books, to the atom: every tip the directory took is its fee,
                # the snapshot's price, the provider's escrow left or the test
                # charge it paid on; the provider charged exactly what it was paid.
                state = await d.state()
                assert state["spend"] == [{"ts": START, "uid": PROVIDER, "tool": "test", "atoms": TEST_PRICE}]
                assert [e["action"] for e in state["adminlog"]] == ["approve"]
                assert state["adminlog"][0] == {
                    "ts": START,
                    "actor": ADMIN,
                    "action": "approve",
                    "args": {"uid": PROVIDER},
                }
                tips = FEE + TEST_MAX + SNAPSHOT_PRICE
                escrow = await d.balance(PROVIDER)
                assert escrow == TEST_MAX - TEST_PRICE
                assert await d.balance(ADMIN) == 0
                paid_out = sum(atoms for _, atoms in d.payments)
                assert FEE + SNAPSHOT_PRICE + escrow + paid_out == tips
                assert paid_out == TEST_PRICE
                assert d.failed_payments == []
                assert await provider.balance(DIRECTORY) == 0
                assert len(runs) == 1


async def go_verify(binary: Path, signed: dict[str, Any], pub: str) -> dict[str, Any]:
    """``brmcp-goref snapshot verify`` on ``signed`` against ``pub``."""
    done = await anyio.run_process(
        [str(binary), "snapshot", "verify", "-pub", pub], input=_compact(signed).encode()
    )
    out: dict[str, Any] = json.loads(done.stdout)
    return out


async def test_listing_of_a_go_provider_with_autofund(tmp_path: Path, goref_binary: Path) -> None:
    """The reference's Registrant at PROVIDER funds its listing under
    AutoFund; the directory pays for its test call; both payments are
    settled through the fixtures, each crediting the other side's ledger."""
    holder: dict[str, Any] = {}

    async def provider_pays(payee: str, atoms: int) -> None:
        assert payee == DIRECTORY
        await holder["dir"].credit_tip(PROVIDER, atoms)

    async def directory_pays(payee: str, atoms: int) -> None:
        assert payee == PROVIDER
        await holder["prov"].credit(DIRECTORY, atoms)

    async with (
        Fabric() as fabric,
        go_directory(
            fabric, goref_binary, tmp_path / "dir", POLICY, pay=directory_pays, args=["-now", str(START)]
        ) as d,
        go_autofund_provider(
            fabric,
            goref_binary,
            tmp_path / "prov",
            [DIRECTORY],
            price=TEST_PRICE,
            test_max=TEST_MAX,
            max_per_request=FEE + TEST_MAX,
            pay=provider_pays,
            args=["-now", str(START)],
        ) as prov,
        fabric.router(ADMIN) as admin_router,
    ):
        holder["dir"], holder["prov"] = d, prov
        assert await prov.register(DIRECTORY) == ""
        assert prov.payments == [(DIRECTORY, FEE + TEST_MAX)]
        entry = await wait_state(d, PROVIDER, "pending_review")
        assert entry["reg"]["testOutcome"] == "ok"
        assert [t["name"] for t in entry["reg"]["catalog"]] == ["echo", "listing_invite", "test"]
        # Our Registrant's listing_invite takes the same input as the reference's.
        (go_invite,) = (t for t in entry["reg"]["catalog"] if t["name"] == "listing_invite")
        assert _shape(go_invite["inputSchema"]) == _shape(INVITE_SCHEMA), go_invite["inputSchema"]
        assert d.payments == [(PROVIDER, TEST_PRICE)]
        assert prov.executions("test") == 1
        assert await prov.balance(DIRECTORY) == 0
        ((dir_uid, last, error),) = prov.notices
        assert (dir_uid, error) == (DIRECTORY, "")
        assert last["state"] in {"crawling", "testing", "pending_review"}
        assert last["feeAtoms"] == FEE

        async with session(admin_router, DIRECTORY) as a:
            assert ok(await a.call_tool("approve", {"uid": PROVIDER})) == {
                "state": "listed",
                "expiresAt": EXPIRES,
            }
            hits = ok(await a.call_tool("search", {"tags": ["go"], "maxPriceAtoms": TEST_PRICE}))
            assert [(h["tool"], h.get("priceAtoms")) for h in hits["hits"]] == [
                ("echo", None),
                ("listing_invite", None),
                ("test", TEST_PRICE),
            ]

        # A second Register while listed and far from expiry is a no-op.
        assert await prov.register(DIRECTORY) == ""
        assert prov.payments == [(DIRECTORY, FEE + TEST_MAX)]
        assert prov.notices[-1] == (DIRECTORY, {"state": "listed", "expiresAt": EXPIRES}, "")
        assert await d.balance(PROVIDER) == TEST_MAX - TEST_PRICE
        assert FEE + await d.balance(PROVIDER) + sum(a for _, a in d.payments) == FEE + TEST_MAX


async def test_federation_lead_becomes_a_listing(tmp_path: Path, goref_binary: Path) -> None:
    """A second reference directory trusts the first's snapshot key, buys
    its snapshot out of pocket (a lead appears), invites the lead through
    the provider's ``listing_invite`` and the provider's Registrant
    registers there too, funding it under AutoFund."""
    peers: dict[str, Any] = {}

    async def provider_pays(payee: str, atoms: int) -> None:
        await peers[payee].credit_tip(PROVIDER, atoms)

    async def first_pays(payee: str, atoms: int) -> None:
        assert payee == PROVIDER
        await peers[PROVIDER].credit(DIRECTORY, atoms)

    async def second_pays(payee: str, atoms: int) -> None:
        # The second directory pays the provider's test and the first
        # directory's snapshot.
        if payee == PROVIDER:
            await peers[PROVIDER].credit(PEER_DIRECTORY, atoms)
        else:
            assert payee == DIRECTORY
            await peers[DIRECTORY].credit_tip(PEER_DIRECTORY, atoms)

    now = ["-now", str(START)]
    async with (
        Fabric() as fabric,
        go_directory_pair(
            fabric, goref_binary, tmp_path, POLICY, first_pays=first_pays, second_pays=second_pays, args=now
        ) as (first, second),
        go_autofund_provider(
            fabric,
            goref_binary,
            tmp_path / "prov",
            [DIRECTORY, PEER_DIRECTORY],
            price=TEST_PRICE,
            test_max=TEST_MAX,
            pay=provider_pays,
            args=now,
        ) as prov,
        fabric.router(ADMIN) as admin_router,
        session(admin_router, DIRECTORY) as admin_first,
        session(admin_router, PEER_DIRECTORY) as admin_second,
    ):
        peers.update({DIRECTORY: first, PEER_DIRECTORY: second, PROVIDER: prov})
        assert await prov.register(DIRECTORY) == ""
        await wait_state(first, PROVIDER, "pending_review")
        ok(await admin_first.call_tool("approve", {"uid": PROVIDER}))

        assert err(await admin_second.call_tool("verify_peer", {"uid": DIRECTORY})) == (
            "not a curated peer; add_peer first"
        )
        assert err(await admin_second.call_tool("add_peer", {"uid": "ab", "pubKey": first.pub_key})) == (
            "uid (64-hex) and pubKey are required"
        )
        added = await admin_second.call_tool("add_peer", {"uid": DIRECTORY, "pubKey": first.pub_key})
        assert ok(added) == {"added": True}
        assert ok(await admin_second.call_tool("verify_peer", {"uid": DIRECTORY})) == {"newLeads": 1}
        assert second.payments == [(DIRECTORY, SNAPSHOT_PRICE)]
        assert await first.balance(PEER_DIRECTORY) == 0
        lead = {
            "providerUid": PROVIDER,
            "peerUid": DIRECTORY,
            "description": "interop provider",
            "tags": ["go"],
            "state": "new",
            "createdAt": START,
            "updatedAt": START,
        }
        assert ok(await admin_second.call_tool("leads", {})) == {"leads": [lead]}
        assert ok(await admin_second.call_tool("verify_peer", {"uid": DIRECTORY})) == {"newLeads": 0}
        assert second.payments == [(DIRECTORY, SNAPSHOT_PRICE)] * 2

        # The invite is accepted; the Registrant registers and funds at once.
        pursued = ok(await admin_second.call_tool("pursue_lead", {"uid": PROVIDER}))
        assert pursued["providerUid"] == PROVIDER
        assert pursued["state"] in {"invited", "converted"}
        entry = await wait_state(second, PROVIDER, "pending_review")
        assert entry["reg"]["testOutcome"] == "ok"
        leads = ok(await admin_second.call_tool("leads", {}))
        assert leads == {"leads": [{**lead, "state": "converted"}]}
        assert prov.payments == [(DIRECTORY, FEE + TEST_MAX), (PEER_DIRECTORY, FEE + TEST_MAX)]
        assert second.payments == [(DIRECTORY, SNAPSHOT_PRICE)] * 2 + [(PROVIDER, TEST_PRICE)]
        assert prov.executions("test") == 2
        assert first.suggestions == second.suggestions == []
        assert first.introductions == second.introductions == []
        state = await second.state()
        assert state["peers"] == {
            DIRECTORY: {"pubKey": first.pub_key, "addedAt": START, "lastVerifiedAt": START}
        }
        assert [e["action"] for e in state["adminlog"]] == [
            "add_peer",
            "verify_peer",
            "verify_peer",
            "pursue_lead",
        ]
        assert [(s["uid"], s["tool"], s["atoms"]) for s in state["spend"]] == [
            (DIRECTORY, "get_snapshot", SNAPSHOT_PRICE),
            (DIRECTORY, "get_snapshot", SNAPSHOT_PRICE),
            (PROVIDER, "test", TEST_PRICE),
        ]
        # Each directory kept its fee and the escrow left; the first also
        # sold two snapshots; every payment landed and was charged.
        assert await first.balance(PROVIDER) == await second.balance(PROVIDER) == TEST_MAX - TEST_PRICE
        assert await prov.balance(DIRECTORY) == await prov.balance(PEER_DIRECTORY) == 0
