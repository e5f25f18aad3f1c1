"""A provider's bot pool in the directory (docs/directory.md §Reputation,
"The pool"; brmcp/directory/db/_poolinfo.py): the crawl records the
``brmcp/pool`` announcement of the provider's ``tools/list`` ``_meta`` and
``get_provider`` shows it as ``pool``, only when it is well formed, names
the provider among its members and carries the provider's own receipt key.
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st_

import brmcp.directory.db._poolinfo as poolinfo
from brmcp.directory.model import STATE_PENDING_REVIEW
from brmcp.protocol.receipts import ReceiptSigner
from brmcp.server import Harness
from brmcp.server.pool import MAX_MEMBERS, POOL_META_KEY, PoolConfig
from brmcp.testing import uid
from tests.kit import until

from .stack import (
    ADMIN,
    BUDGET,
    CALLER,
    FEE,
    PROVIDER,
    PROVIDER2,
    Stack,
    directory_stack,
    provider_harness,
    register_args,
)

TIP_SEQ = itertools.count(5000)
KEY = "ab" * 32
OTHER_KEY = "cd" * 32


def signer_of(seed: int, bot: str) -> ReceiptSigner:
    return ReceiptSigner(Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32), bot=bot)


def announced(pool_id: Any = "fortunes", members: Any = None, key: Any = KEY, **extra: Any) -> dict[str, Any]:
    """A ``tools/list`` ``_meta`` announcing a pool (PROVIDER and PROVIDER2 by default)."""
    body = {"id": pool_id, "members": [PROVIDER, PROVIDER2] if members is None else members, "key": key}
    return {"brmcp/receiptKey": KEY, POOL_META_KEY: body | extra}


async def list_provider(st: Stack, tmp_path: Path, signer: ReceiptSigner, pool: PoolConfig | None) -> Harness:
    """Register, fund, verify and approve PROVIDER, announcing ``pool``
    under ``signer``'s key (the harness announces a pool only with its
    signer set and its uid among the members: WIRE.md §Pools)."""
    harness, _runs = provider_harness(tmp_path / "provider")
    harness.config.receipt_signer = signer
    # The pool block without a shared book: only the announcement is under
    # test here (the harness refuses it at construction, not when set later).
    harness.config.pool = pool
    await st.add_provider(PROVIDER, harness)
    await st.ok(PROVIDER, "register", register_args())
    await st.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1000, next(TIP_SEQ))

    async def parked() -> bool:
        return (await st.directory.pipeline.status(PROVIDER)).state == STATE_PENDING_REVIEW

    await until(parked)
    await st.ok(ADMIN, "approve", {"uid": PROVIDER})
    return harness


# -- through a crawl ------------------------------------------------------------------


async def test_get_provider_shows_the_pool_the_crawl_read(tmp_path: Path) -> None:
    signer = signer_of(1, PROVIDER)
    pool = PoolConfig("fortunes", (PROVIDER, PROVIDER2))
    async with directory_stack(tmp_path) as st:
        harness = await list_provider(st, tmp_path, signer, pool)
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert out["receiptKey"] == signer.public_hex
        assert out["pool"] == {"id": "fortunes", "members": [PROVIDER, PROVIDER2], "key": signer.public_hex}
        hits = (await st.ok(CALLER, "search", {"query": "fortune"}))["hits"]
        assert "pool" not in hits[0]

        # The provider leaves the pool: the next re-crawl drops it.
        harness.config.pool = None
        await st.ok(ADMIN, "recrawl", {"uid": PROVIDER})
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert out["receiptKey"] == signer.public_hex
        assert "pool" not in out

        # It joins again under a new key: shown with that key.
        rotated = signer_of(2, PROVIDER)
        harness.config.receipt_signer = rotated
        harness.config.pool = pool
        await st.ok(ADMIN, "recrawl", {"uid": PROVIDER})
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert out["pool"]["key"] == out["receiptKey"] == rotated.public_hex


async def test_a_listing_without_a_pool_shows_none(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        await list_provider(st, tmp_path, signer_of(1, PROVIDER), None)
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert "receiptKey" in out
        assert "pool" not in out


async def test_a_pool_key_other_than_the_receipt_key_shows_no_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile provider claims a pool under a key it does not sign with
    (another pool's key, to borrow its standing): no pool is shown."""
    signer = signer_of(1, PROVIDER)
    async with directory_stack(tmp_path) as st:
        harness, _runs = provider_harness(tmp_path / "provider")
        harness.config.receipt_signer = signer
        forged = {
            "id": "fortunes",
            "members": [PROVIDER, PROVIDER2],
            "key": signer_of(7, PROVIDER2).public_hex,
        }
        monkeypatch.setattr(
            harness, "_key_meta", lambda: {"brmcp/receiptKey": signer.public_hex, POOL_META_KEY: forged}
        )
        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args())
        await st.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1000, next(TIP_SEQ))

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == STATE_PENDING_REVIEW

        await until(parked)
        await st.ok(ADMIN, "approve", {"uid": PROVIDER})
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert out["receiptKey"] == signer.public_hex
        assert "pool" not in out


# -- the announcement's rules ------------------------------------------------------------


def test_a_well_formed_announcement_is_kept_in_canonical_form() -> None:
    upper = [PROVIDER.upper(), PROVIDER2]
    assert poolinfo.pool_from_meta(announced(members=upper, extra_key=1), PROVIDER, KEY) == {
        "id": "fortunes",
        "members": [PROVIDER, PROVIDER2],
        "key": KEY,
    }


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        (None, "no _meta"),
        ({}, "no announcement"),
        ({POOL_META_KEY: "fortunes"}, "not an object"),
        (announced(key=OTHER_KEY), "another key than the receipt key"),
        (announced(key=KEY.upper()), "a key not in lowercase hex"),
        (announced(key=KEY[:-2]), "a short key"),
        (announced(key=None), "no key"),
        (announced(members=[PROVIDER2, uid(60)]), "the provider is not a member"),
        (announced(members=[PROVIDER]), "one member"),
        (announced(members=[PROVIDER, PROVIDER]), "a repeated member"),
        (announced(members=[PROVIDER, *(uid(100 + i) for i in range(MAX_MEMBERS))]), "17 members"),
        (announced(members=[PROVIDER, "not a uid"]), "a member that is not a uid"),
        (announced(members=f"{PROVIDER},{PROVIDER2}"), "members not a list"),
        (announced(pool_id=""), "an empty id"),
        (announced(pool_id="-fortunes"), "an id starting with punctuation"),
        (announced(pool_id="x" * 65), "an id of 65 characters"),
        (announced(pool_id="for tunes"), "a space in the id"),
        (announced(pool_id=7), "an id that is not a string"),
    ],
)
def test_a_bad_announcement_is_no_pool(meta: Any, why: str) -> None:
    assert poolinfo.pool_from_meta(meta, PROVIDER, KEY) is None, why


def test_no_receipt_key_means_no_pool() -> None:
    assert poolinfo.pool_from_meta(announced(), PROVIDER, "") is None


_JSON = st_.recursive(
    st_.none() | st_.booleans() | st_.integers() | st_.text(max_size=70),
    lambda inner: st_.lists(inner, max_size=18) | st_.dictionaries(st_.text(max_size=8), inner, max_size=4),
    max_leaves=40,
)


@given(
    body=st_.fixed_dictionaries(
        {},
        optional={
            "id": _JSON | st_.sampled_from(["fortunes", "a.b_c-1"]),
            "members": _JSON
            | st_.lists(st_.sampled_from([PROVIDER, PROVIDER2, PROVIDER.upper(), uid(61)]), max_size=18),
            "key": _JSON | st_.sampled_from([KEY, OTHER_KEY]),
        },
    )
)
def test_any_announcement_is_kept_only_when_it_is_this_providers_pool(body: dict[str, Any]) -> None:
    """Whatever a provider announces, the recorded pool is None or carries
    the provider's receipt key, 2..16 distinct lowercase uids with the
    provider among them, and an id the pool block would accept."""
    got = poolinfo.pool_from_meta({POOL_META_KEY: body}, PROVIDER, KEY)
    if got is None:
        return
    assert set(got) == {"id", "members", "key"}
    assert got["key"] == KEY
    assert 2 <= len(got["members"]) <= MAX_MEMBERS
    assert len(set(got["members"])) == len(got["members"])
    assert PROVIDER in got["members"]
    assert all(m == m.lower() and len(m) == 64 for m in got["members"])
    assert PoolConfig(got["id"], tuple(got["members"])).id == body["id"]


# -- the table ------------------------------------------------------------------------------


def _db() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    poolinfo.open_tables(conn)
    return conn


def test_a_run_pool_becomes_the_listing_pool_only_at_its_own_publication() -> None:
    conn = _db()
    pool = poolinfo.pool_from_meta(announced(), PROVIDER, KEY)
    assert pool is not None
    poolinfo.set_run_pool(conn, PROVIDER, "reg1", pool)
    assert poolinfo.listed_pool(conn, PROVIDER) is None
    poolinfo.adopt_run_pool(conn, PROVIDER, "reg1")
    assert poolinfo.listed_pool(conn, PROVIDER) == pool
    # A run that crawled no pool replaces it at publication.
    poolinfo.set_run_pool(conn, PROVIDER, "reg2", None)
    assert poolinfo.listed_pool(conn, PROVIDER) == pool
    poolinfo.adopt_run_pool(conn, PROVIDER, "reg2")
    assert poolinfo.listed_pool(conn, PROVIDER) is None
    # A run that did not crawl (another reg id) leaves the listing's pool.
    poolinfo.set_listed_pool(conn, PROVIDER, pool)
    poolinfo.set_run_pool(conn, PROVIDER, "reg3", None)
    poolinfo.adopt_run_pool(conn, PROVIDER, "reg4")
    assert poolinfo.listed_pool(conn, PROVIDER) == pool
    assert conn.execute("SELECT COUNT(*) FROM dir_pools WHERE scope = 'run'").fetchone() == (0,)


def test_a_pool_shows_only_under_the_listings_receipt_key() -> None:
    conn = _db()
    pool = poolinfo.pool_from_meta(announced(), PROVIDER, KEY)
    poolinfo.set_listed_pool(conn, PROVIDER, pool)
    assert poolinfo.shown_pool(conn, PROVIDER, KEY) == pool
    assert poolinfo.shown_pool(conn, PROVIDER, OTHER_KEY) is None
    assert poolinfo.shown_pool(conn, PROVIDER, "") is None
    assert poolinfo.shown_pool(conn, PROVIDER2, KEY) is None
