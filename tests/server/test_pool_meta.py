"""The ``pool`` block and its announcement (WIRE.md §Pools;
brmcp/server/pool.py, HarnessConfig.pool, brmcp-serve's ``pool`` key).

The block is validated (2..16 distinct 64-hex uids, a plain id, a
PostgreSQL store); a member announces ``brmcp/pool`` (id, members and the
pool's receipt key, the same as its ``brmcp/receiptKey``) in every
``tools/list`` answer and in a marked ``initialize`` answer, only once its
receipt signer names its own uid and that uid is a member.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st
from mcp import ClientSession, types

from brmcp.protocol.receipts import RECEIPT_KEY_META, ReceiptSigner
from brmcp.serve.config import ServeConfig, ServeConfigError
from brmcp.server import Harness, HarnessConfig, HarnessError
from brmcp.server.pool import MAX_MEMBERS, POOL_META_KEY, PoolConfig, parse_pool, pool_meta
from brmcp.testing import uid
from tests.kit import ALICE, BOT
from tests.kit.harness import served

SIBLING = uid(20)
MEMBERS = [BOT, SIBLING]


def _signer(bot: str) -> ReceiptSigner:
    return ReceiptSigner(Ed25519PrivateKey.generate(), bot=bot)


# -- the block ---------------------------------------------------------------------------


def test_a_valid_block_parses_and_round_trips() -> None:
    pool = parse_pool({"id": "fortunes.eu-1", "members": [BOT.upper(), SIBLING]})
    assert pool == PoolConfig("fortunes.eu-1", (BOT, SIBLING))
    assert parse_pool(pool.to_json()) == pool
    assert parse_pool(None) is None


@pytest.mark.parametrize(
    ("block", "names"),
    [
        ([], "must be an object"),
        ({"id": "p", "members": MEMBERS, "key": "ab"}, "unknown key 'key'"),
        ({"members": MEMBERS}, "id must be"),
        ({"id": "", "members": MEMBERS}, "id must be"),
        ({"id": "-p", "members": MEMBERS}, "id must be"),
        ({"id": "a b", "members": MEMBERS}, "id must be"),
        ({"id": "p" * 65, "members": MEMBERS}, "id must be"),
        ({"id": 7, "members": MEMBERS}, "id must be"),
        ({"id": "p"}, "members must be a list"),
        ({"id": "p", "members": BOT}, "members must be a list"),
        ({"id": "p", "members": [BOT]}, "members must hold 2..16"),
        (
            {"id": "p", "members": [f"{n + 1:064x}" for n in range(MAX_MEMBERS + 1)]},
            "members must hold 2..16",
        ),
        ({"id": "p", "members": [BOT, BOT.upper()]}, "members[1] repeats"),
        ({"id": "p", "members": [BOT, "zz" * 32]}, "members[1] must be a 64-hex"),
        ({"id": "p", "members": [BOT, SIBLING[:-1]]}, "members[1] must be a 64-hex"),
        ({"id": "p", "members": [BOT, None]}, "members[1] must be a 64-hex"),
    ],
)
def test_a_bad_block_is_one_line_naming_what_to_fix(block: Any, names: str) -> None:
    with pytest.raises(ValueError, match=r"^[^\n]+$") as caught:
        parse_pool(block)
    assert names in str(caught.value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=70) | st.sampled_from([BOT, SIBLING, "p"]),
    lambda inner: (
        st.lists(inner, max_size=18) | st.dictionaries(st.sampled_from(["id", "members", "x"]), inner)
    ),
    max_leaves=40,
)


@given(_JSON)
def test_any_json_is_a_pool_or_a_value_error(value: Any) -> None:
    try:
        pool = parse_pool(value)
    except ValueError as exc:
        problem = str(exc)
    else:
        assert pool is None or 2 <= len(pool.members) <= MAX_MEMBERS
        return
    assert problem
    assert "\n" not in problem


def test_the_member_check_names_the_uid() -> None:
    pool = PoolConfig("p", (BOT, SIBLING))
    pool.check_member(BOT.upper())
    with pytest.raises(ValueError, match=f"this bot's uid {uid(30)} is not among pool.members"):
        pool.check_member(uid(30))


def test_brmcp_json_takes_a_pool_with_a_postgresql_store() -> None:
    text = json.dumps(
        {"allowed_uids": [], "store": "postgresql://bot@db/book", "pool": {"id": "p", "members": MEMBERS}}
    )
    config = ServeConfig.parse(text)
    assert config.pool == PoolConfig("p", (BOT, SIBLING))
    assert ServeConfig.parse(config.to_json()).pool == config.pool


def test_brmcp_json_refuses_a_pool_on_sqlite_and_a_bad_block() -> None:
    with pytest.raises(ServeConfigError, match="pool: the members share one book"):
        ServeConfig.parse(json.dumps({"pool": {"id": "p", "members": MEMBERS}}))
    with pytest.raises(ServeConfigError, match=r"brmcp.json: pool: members must hold 2\.\.16"):
        ServeConfig.parse(json.dumps({"store": "postgresql://db/b", "pool": {"id": "p", "members": [BOT]}}))


def test_a_harness_pool_needs_a_shared_book_and_a_key(tmp_path: Path) -> None:
    pool = PoolConfig("p", (BOT, SIBLING))
    with pytest.raises(HarnessError, match="set store to a PostgreSQL URL"):
        Harness(HarnessConfig(data_dir=tmp_path, pool=pool, receipt_signer=_signer(BOT)))


# -- the announcement --------------------------------------------------------------------


async def _announcements(harness: Harness) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``_meta`` of a tools/list answer and of a marked initialize answer."""
    async with served(harness) as srv:
        async with srv.client(ALICE) as s:
            listed = await s.list_tools()
        conn = srv.clients[ALICE].dial(BOT)
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=10) as s:
            params = types.InitializeRequestParams(
                protocol_version="2025-11-25",
                capabilities=types.ClientCapabilities(),
                client_info=types.Implementation(name="probe", version="1"),
                _meta={"brmcp/listTools": True},  # type: ignore[arg-type]
            )
            first = await s.send_request(types.InitializeRequest(params=params), types.InitializeResult)
    assert listed.meta is not None
    assert first.meta is not None
    return listed.meta, first.meta


async def test_a_member_announces_its_pool_with_the_receipt_key(postgres_url: str) -> None:
    signer = _signer(BOT)
    pool = PoolConfig("fortunes", (BOT, SIBLING))
    harness = Harness(
        HarnessConfig(store=postgres_url, allowed_peers={ALICE}, receipt_signer=signer, pool=pool)
    )
    listed, first = await _announcements(harness)
    expected = {"id": "fortunes", "members": [BOT, SIBLING], "key": signer.public_hex}
    assert listed[POOL_META_KEY] == expected
    assert listed[RECEIPT_KEY_META] == signer.public_hex
    assert first[POOL_META_KEY] == expected
    assert first["brmcp/tools"]["_meta"][POOL_META_KEY] == expected
    assert pool_meta(pool, signer.public_hex) == {POOL_META_KEY: expected}


@pytest.mark.parametrize("bot", ["", uid(30)])
async def test_no_announcement_before_the_own_uid_is_known_or_when_it_is_not_a_member(
    postgres_url: str, bot: str
) -> None:
    harness = Harness(
        HarnessConfig(
            store=postgres_url,
            allowed_peers={ALICE},
            receipt_signer=_signer(bot),
            pool=PoolConfig("fortunes", (BOT, SIBLING)),
        )
    )
    listed, first = await _announcements(harness)
    assert POOL_META_KEY not in listed
    assert POOL_META_KEY not in first
    assert RECEIPT_KEY_META in listed


async def test_a_harness_without_a_pool_announces_none(postgres_url: str) -> None:
    harness = Harness(HarnessConfig(store=postgres_url, allowed_peers={ALICE}, receipt_signer=_signer(BOT)))
    listed, first = await _announcements(harness)
    assert POOL_META_KEY not in listed
    assert POOL_META_KEY not in first
