"""The ``brmcp/pool`` announcement as a caller parses it (WIRE.md §Pools;
brmcp/protocol/pool.py): what a member writes parses back; anything else,
whatever its shape, parses to None and never raises."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brmcp.protocol.pool import POOL_META_KEY, PoolAnnouncement, pool_from_meta
from brmcp.server.pool import PoolConfig, pool_meta
from brmcp.testing import uid

A, B = uid(1), uid(2)
KEY = "ab" * 32


def test_what_a_member_writes_parses_back() -> None:
    meta = pool_meta(PoolConfig("fortunes.eu-1", (A, B)), KEY)
    assert pool_from_meta(meta) == PoolAnnouncement("fortunes.eu-1", (A, B), KEY)
    announcement = pool_from_meta({POOL_META_KEY: {"id": "p", "members": [A.upper(), B], "key": KEY}})
    assert announcement is not None
    assert announcement.members == (A, B)
    assert announcement.lists(A.upper())
    assert announcement.pool == ("p", KEY)


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        {"id": "p", "members": [A, B]},
        {"id": "p", "members": [A, B], "key": KEY, "extra": 1},
        {"id": "-p", "members": [A, B], "key": KEY},
        {"id": "p" * 65, "members": [A, B], "key": KEY},
        {"id": "p", "members": [A], "key": KEY},
        {"id": "p", "members": [A, A.upper()], "key": KEY},
        {"id": "p", "members": [A, "zz" * 32], "key": KEY},
        {"id": "p", "members": [A, B], "key": KEY.upper()},
        {"id": "p", "members": [A, B], "key": KEY[:-2]},
        {"id": "p", "members": [A, *(uid(n) for n in range(10, 26))], "key": KEY},
    ],
)
def test_a_malformed_announcement_is_none(value: Any) -> None:
    assert pool_from_meta({POOL_META_KEY: value}) is None


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=70) | st.sampled_from([A, B, KEY, "p"]),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.sampled_from(["id", "members", "key", "x"]), inner)
    ),
    max_leaves=20,
)


@given(_JSON)
def test_any_value_parses_or_is_none_without_raising(value: Any) -> None:
    parsed = pool_from_meta({POOL_META_KEY: value})
    if parsed is not None:
        assert 2 <= len(parsed.members) <= 16
        assert len(set(parsed.members)) == len(parsed.members)
        assert parsed.key == value["key"]
