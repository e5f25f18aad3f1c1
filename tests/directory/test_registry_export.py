"""Listings as MCP Registry ``server.json`` documents (brmcp/directory/tools/_registry.py,
docs/directory.md §Registry export): every document validates against the
vendored schema, hostile listings included; pages follow the registry's
``GET /v0/servers`` shape and cursor."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator

import brmcp.directory.db as dstore
import brmcp.directory.tools._registry as registry
from brmcp.directory import TestSpec
from brmcp.directory.model import ShapeError
from brmcp.directory.tools import (
    BR_META_KEY,
    DIRECTORY_META_KEY,
    MAX_DOC_TOOLS,
    MAX_EXPORT_LIMIT,
    PUBLISHER_META_KEY,
    SCHEMA_URL,
    ExportIn,
    export_page,
    load_schema,
    server_json,
    server_name,
)

from .stack import CALLER, DIRECTORY, START, Stack, directory_stack

DIR_UID = "0123456789abcdef" + "f" * 48
A = "a" * 64
B = "b" * 64
CATALOG = json.dumps(
    [
        {"name": "fortune", "description": "a fortune", "_meta": {"brmcp/priceAtoms": 500}},
        {"name": "echo", "description": "free"},
        {"name": "quote", "_meta": {"brmcp/pricing": "dynamic"}},
    ]
)
VALIDATOR = Draft7Validator(load_schema(), format_checker=Draft7Validator.FORMAT_CHECKER)


def listing(uid: str = A, **kw: Any) -> dstore.Listing:
    values: dict[str, Any] = {
        "uid": uid,
        "description": "fortunes on demand",
        "tags": ("fortune", "fun"),
        "test": TestSpec(tool="fortune", max_atoms=1_000),
        "catalog": CATALOG,
        "catalog_checked_at": int(START) + 60,
        "last_verified_execution": int(START) + 30,
        "test_latency_ms": 12,
        "approved_at": int(START),
        "renewed_at": 0,
        "expires_at": int(START) + 30 * 86_400,
    }
    values.update(kw)
    return dstore.Listing(**values)


def assert_valid(document: dict[str, Any]) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(document)]
    assert errors == []
    # The document travels as UTF-8 JSON.
    json.dumps(document, ensure_ascii=False).encode("utf-8")


def br(document: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = document["_meta"][PUBLISHER_META_KEY][BR_META_KEY]
    return meta


# -- the vendored schema -----------------------------------------------------------------


def test_the_vendored_schema_is_the_file_its_readme_names() -> None:
    folder = Path(registry.__file__).parent.parent / "schemas"
    readme = (folder / "README.md").read_text(encoding="utf-8")
    recorded = re.search(r"sha256 of the file: `([0-9a-f]{64})`", readme)
    assert recorded is not None
    assert hashlib.sha256((folder / "server.schema.json").read_bytes()).hexdigest() == recorded.group(1)
    assert re.search(r"commit: `[0-9a-f]{40}`", readme)
    assert load_schema()["$id"] == SCHEMA_URL
    assert SCHEMA_URL in readme
    Draft7Validator.check_schema(load_schema())


def test_the_schema_refuses_what_a_document_must_avoid() -> None:
    # The bounds the export relies on are in the vendored file.
    good = server_json(listing(), DIR_UID)
    for key, bad in [
        ("name", "no-slash"),
        ("name", "io.bisonrelay.x/has space"),
        ("description", "x" * 101),
        ("description", ""),
        ("remotes", [{"type": "bisonrelay", "url": "br://x"}]),
    ]:
        assert not VALIDATOR.is_valid({**good, key: bad}), key


# -- one document ------------------------------------------------------------------------


def test_a_listing_becomes_a_valid_document() -> None:
    document = server_json(listing(), DIR_UID, directory_name="brmcpdir")
    assert_valid(document)
    assert document["$schema"] == SCHEMA_URL
    assert document["name"] == f"io.bisonrelay.0123456789abcdef/{A}"
    assert document["description"] == "fortunes on demand"
    assert re.fullmatch(r"0\.0\.0\+catalog\.[0-9a-f]{16}", document["version"])
    assert "remotes" not in document
    assert "packages" not in document
    assert "http" not in json.dumps(document).replace(SCHEMA_URL, "")
    assert br(document) == {
        "transport": "bisonrelay-pm",
        "providerUid": A,
        "directoryUid": DIR_UID,
        "directoryName": "brmcpdir",
        "description": "fortunes on demand",
        "tags": ["fortune", "fun"],
        "catalogCheckedAt": int(START) + 60,
        "lastVerifiedExecution": int(START) + 30,
        "verifiedTool": "fortune",
        "approvedAt": int(START),
        "renewedAt": 0,
        "expiresAt": int(START) + 30 * 86_400,
        "toolCount": 3,
        "tools": [
            {"name": "fortune", "priceAtoms": 500},
            {"name": "echo", "priceAtoms": 0},
            {"name": "quote", "pricing": "dynamic"},
        ],
    }


def test_the_name_is_the_provider_and_stays_put() -> None:
    first = server_json(listing(), DIR_UID)["name"]
    assert server_json(listing(description="other words", catalog="[]"), DIR_UID)["name"] == first
    assert server_json(listing(B), DIR_UID)["name"] != first
    # Another directory lists the same provider under its own namespace.
    assert server_name("fedcba9876543210" + "0" * 48, A) == f"io.bisonrelay.fedcba9876543210/{A}"
    # Uids outside the name's alphabet are hashed, distinctly.
    odd = [server_name("not hex at all", uid) for uid in ("a b", "a/b", "ü" * 300, "")]
    assert len(set(odd)) == 4
    for name in odd:
        assert re.fullmatch(r"io\.bisonrelay\.[0-9a-f]{16}/x-[0-9a-f]{40}", name)


def test_the_version_follows_the_catalog_content() -> None:
    version = server_json(listing(), DIR_UID)["version"]
    reordered = json.dumps([dict(reversed(t.items())) for t in json.loads(CATALOG)])
    assert server_json(listing(catalog=reordered, catalog_checked_at=1), DIR_UID)["version"] == version
    assert server_json(listing(catalog="[]"), DIR_UID)["version"] != version


def test_a_long_description_is_cut_to_the_schema_bound() -> None:
    text = "word " * 200
    document = server_json(listing(description=text), DIR_UID)
    assert_valid(document)
    assert len(document["description"]) == 100
    assert document["description"].endswith("…")
    assert br(document)["description"] == text.strip()


@pytest.mark.parametrize("text", ["", "   ", "\x00\x01\x1b\x7f\x9b", "\u202e\u2066", "\ud800"])
def test_a_description_with_nothing_printable_gets_a_fallback(text: str) -> None:
    document = server_json(listing(description=text), DIR_UID)
    assert_valid(document)
    assert document["description"] == "Bison Relay MCP provider aaaaaaaaaaaaaaaa"


def test_control_and_bidi_characters_become_spaces() -> None:
    document = server_json(listing(description="evil\u202etxt.exe\nline\ttwo\x07 \ud83d ok 🦬"), DIR_UID)
    assert_valid(document)
    assert document["description"] == "evil txt.exe line two ok 🦬"


def test_a_huge_catalog_names_the_first_tools_and_counts_all() -> None:
    tools = [{"name": f"tool{i}", "_meta": {"brmcp/priceAtoms": i}} for i in range(5_000)]
    document = server_json(listing(catalog=json.dumps(tools)), DIR_UID)
    assert_valid(document)
    meta = br(document)
    assert meta["toolCount"] == 5_000
    assert meta["toolsTruncated"] is True
    assert meta["tools"] == [{"name": f"tool{i}", "priceAtoms": i} for i in range(MAX_DOC_TOOLS)]


@pytest.mark.parametrize(
    "catalog",
    [
        "",
        "not json",
        "{}",
        "null",
        "[" * 100_000 + "]" * 100_000,
        json.dumps([1, "x", None, [], {"name": 5}, {"name": ""}, {"name": "\x00"}, {"description": "d"}]),
    ],
)
def test_a_broken_catalog_still_gives_a_valid_document(catalog: str) -> None:
    document = server_json(listing(catalog=catalog), DIR_UID)
    assert_valid(document)
    assert br(document)["toolCount"] == 0
    assert br(document)["tools"] == []


def test_odd_prices_claim_nothing_they_do_not_say() -> None:
    tools = [
        {"name": "nan", "_meta": {"brmcp/priceAtoms": math.nan}},
        {"name": "inf", "_meta": {"brmcp/priceAtoms": math.inf}},
        {"name": "fraction", "_meta": {"brmcp/priceAtoms": 7.9}},
        {"name": "bool", "_meta": {"brmcp/priceAtoms": True}},
        {"name": "text", "_meta": {"brmcp/priceAtoms": "5"}},
        {"name": "meta", "_meta": ["x"]},
    ]
    document = server_json(listing(catalog=json.dumps(tools)), DIR_UID)
    assert_valid(document)
    assert br(document)["tools"] == [
        {"name": "nan"},
        {"name": "inf"},
        {"name": "fraction", "priceAtoms": 7},
        {"name": "bool", "priceAtoms": 0},
        {"name": "text", "priceAtoms": 0},
        {"name": "meta", "priceAtoms": 0},
    ]


#: Any text, with lone surrogates, controls and bidi overrides (Python's JSON reads them all).
_ANY_TEXT = st.text(
    st.one_of(
        st.characters(),
        st.characters(categories=["Cs"]),
        st.sampled_from("\u202e\u2066\x00\x1b\x85\n\t "),
    ),
    max_size=1_500,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    description=_ANY_TEXT,
    tags=st.lists(_ANY_TEXT, max_size=20),
    names=st.lists(st.one_of(_ANY_TEXT, st.integers(), st.none()), max_size=40),
    provider=st.text(max_size=300),
    directory=st.text(max_size=300),
    times=st.integers(min_value=-(2**62), max_value=2**62),
)
def test_any_listing_gives_a_valid_document(
    description: str, tags: list[str], names: list[Any], provider: str, directory: str, times: int
) -> None:
    catalog = json.dumps([{"name": name, "description": description} for name in names])
    item = listing(
        provider,
        description=description,
        tags=tuple(tags),
        catalog=catalog,
        catalog_checked_at=times,
        approved_at=times,
        test=TestSpec(tool=description),
    )
    page = export_page([item], directory, directory_name=description)
    entry = page["servers"][0]
    assert_valid(entry["server"])
    assert set(entry["_meta"][DIRECTORY_META_KEY]) == {"status", "publishedAt", "updatedAt", "isLatest"}
    json.dumps(page, ensure_ascii=False).encode("utf-8")


# -- pages -------------------------------------------------------------------------------


def _uid(n: int) -> str:
    return f"{n:064x}"


def _walk(listings: list[dstore.Listing], limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = ""
    while True:
        page = export_page(listings, DIR_UID, ExportIn(cursor=cursor, limit=limit))
        assert page["metadata"]["count"] == len(page["servers"])
        pages.append(
            [
                entry["server"]["_meta"][PUBLISHER_META_KEY][BR_META_KEY]["providerUid"]
                for entry in page["servers"]
            ]
        )
        if "nextCursor" not in page["metadata"]:
            return pages
        cursor = page["metadata"]["nextCursor"]


def test_pages_cover_every_listing_once_in_uid_order() -> None:
    listings = [listing(_uid(n)) for n in (5, 3, 7, 1, 6, 2, 4)]
    assert _walk(listings, 3) == [
        [_uid(1), _uid(2), _uid(3)],
        [_uid(4), _uid(5), _uid(6)],
        [_uid(7)],
    ]
    assert _walk(listings, 7) == [[_uid(n) for n in range(1, 8)]]
    assert _walk([], 3) == [[]]


def test_a_listing_added_or_removed_between_pages_shifts_nothing() -> None:
    listings = [listing(_uid(n)) for n in range(1, 7)]
    first = export_page(listings, DIR_UID, ExportIn(limit=3))
    cursor = first["metadata"]["nextCursor"]
    assert cursor == _uid(3)
    changed = [item for item in listings if item.uid != _uid(2)] + [listing(_uid(0))]
    second = export_page(changed, DIR_UID, ExportIn(cursor=cursor, limit=3))
    assert [e["server"]["name"].split("/")[1] for e in second["servers"]] == [_uid(4), _uid(5), _uid(6)]
    assert second["metadata"] == {"count": 3}


def test_a_page_entry_has_the_registry_response_shape() -> None:
    page = export_page([listing(renewed_at=int(START) + 3_600)], DIR_UID)
    assert list(page) == ["servers", "metadata"]
    (entry,) = page["servers"]
    assert list(entry) == ["server", "_meta"]
    assert entry["_meta"] == {
        DIRECTORY_META_KEY: {
            "status": "active",
            "publishedAt": "2027-01-15T08:00:00Z",
            "updatedAt": "2027-01-15T09:00:00Z",
            "isLatest": True,
        }
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"limit": 0}, "export_registry: limit: got '0', want an integer from 1 to 100"),
        ({"limit": MAX_EXPORT_LIMIT + 1}, "export_registry: limit: got '101', want an integer from 1 to 100"),
        ({"limit": "3"}, "export_registry: limit: got '3', want an integer from 1 to 100"),
        ({"limit": True}, "export_registry: limit: got 'True', want an integer from 1 to 100"),
        ({"limit": 2.5}, "export_registry: limit: got '2.5', want an integer from 1 to 100"),
        (
            {"cursor": 5},
            "export_registry: cursor: got int, want a nextCursor string of at most 256 characters",
        ),
        (
            {"cursor": "c" * 257},
            "export_registry: cursor: got 257 characters, want a nextCursor string of at most 256 characters",
        ),
        ([], "export_registry: arguments: got list, want an object"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args: Any, message: str) -> None:
    with pytest.raises(ShapeError) as caught:
        ExportIn.from_json(args)
    assert str(caught.value) == message


def test_absent_and_null_arguments_take_the_defaults() -> None:
    assert ExportIn.from_json({}) == ExportIn(cursor="", limit=30)
    assert ExportIn.from_json({"cursor": None, "limit": None}) == ExportIn(cursor="", limit=30)
    assert ExportIn.from_json({"cursor": A, "limit": 4.0}) == ExportIn(cursor=A, limit=4)


# -- the tool ----------------------------------------------------------------------------


async def _publish(st_: Stack, item: dstore.Listing) -> None:
    await st_.directory.harness.transact(lambda c: dstore.put_listing(c, item))


async def test_export_registry_serves_pages_for_free(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st_:
        for n in (3, 1, 2):
            await _publish(st_, listing(_uid(n)))
        tools = {t.name: t for t in (await (await st_.session(CALLER)).list_tools()).tools}
        assert tools["export_registry"].meta == {"brmcp/priceAtoms": 0}
        first = await st_.ok(CALLER, "export_registry", {"limit": 2})
        assert first["metadata"] == {"nextCursor": _uid(2), "count": 2}
        second = await st_.ok(CALLER, "export_registry", {"cursor": first["metadata"]["nextCursor"]})
        assert second["metadata"] == {"count": 1}
        entries = first["servers"] + second["servers"]
        for entry in entries:
            assert_valid(entry["server"])
            assert br(entry["server"])["directoryUid"] == DIRECTORY
            assert br(entry["server"])["directoryName"] == "brmcpdir"
        assert [br(e["server"])["providerUid"] for e in entries] == [_uid(1), _uid(2), _uid(3)]
        refused = await st_.error(CALLER, "export_registry", {"limit": 0})
        # The harness checks the input schema first (its bounds are ExportIn's).
        assert refused == 'validating "arguments" at /limit: 0 is less than the minimum of 1'


async def test_export_registry_waits_for_the_directory_uid(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st_:
        await _publish(st_, listing())
        st_.directory.set_self_uid("")
        assert await st_.error(CALLER, "export_registry", {}) == "the directory's uid is not known yet"
