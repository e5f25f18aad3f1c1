"""A forged ``cursor`` reaching the directory's ``search`` tool through its
real entry point (an MCP session over the Bison Relay fabric) gets the
documented refusal of docs/directory.md §Search and nothing else: no
Python exception text, whatever the cursor decodes to."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp.directory.db import RANK_CATALOG, RANK_RELEVANCE

from .stack import CALLER, directory_stack


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _json_cursor(value: Any) -> str:
    return _b64(json.dumps(value).encode())


_HUGE = st.integers(min_value=2**63, max_value=2**4000) | st.integers(max_value=-(2**63) - 1)
_SCALAR = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_NESTED = st.recursive(_SCALAR, lambda inner: st.lists(inner, max_size=3), max_leaves=8)

_FORGED = st.one_of(
    # a key whose position does not fit SQLite INTEGER
    st.builds(lambda n: _json_cursor([RANK_CATALOG, "a" * 64, n]), _HUGE),
    st.builds(lambda n: _json_cursor([RANK_RELEVANCE, 1.5, "a" * 64, "t", n]), _HUGE),
    # deep nesting, far past Python's recursion limit
    st.integers(min_value=1_000, max_value=20_000).map(lambda depth: _b64(b"[" * depth + b"]" * depth)),
    st.integers(min_value=1_000, max_value=5_000).map(
        lambda depth: _b64(b'{"a":' * depth + b"1" + b"}" * depth)
    ),
    # garbage: not base64, base64 of non-UTF-8, of non-JSON
    st.text(min_size=1, max_size=200),
    st.binary(min_size=1, max_size=200).map(_b64),
    # valid-looking JSON of the wrong shape or types
    st.builds(lambda key: _json_cursor([RANK_CATALOG, *key]), st.lists(_NESTED, max_size=4)),
    st.builds(lambda key: _json_cursor([RANK_RELEVANCE, *key]), st.lists(_NESTED, max_size=6)),
    st.builds(lambda s: _json_cursor([RANK_CATALOG, s, 0]), st.text(max_size=10).map(lambda t: "\ud800" + t)),
    _NESTED.map(_json_cursor),
)

_RANKS = [RANK_CATALOG, RANK_RELEVANCE]
_PYTHON_WORDS = ("Traceback", "Python int", "recursion", "SQLite", "Error", "codec", "Expecting")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cursors=st.lists(
        st.tuples(_FORGED, st.sampled_from([RANK_CATALOG, RANK_RELEVANCE])), min_size=1, max_size=6
    )
)
def test_a_forged_cursor_gets_the_documented_refusal(tmp_path: Path, cursors: list[tuple[str, str]]) -> None:
    # One data directory per example (hypothesis reuses the fixture).
    data_dir = tmp_path / secrets.token_hex(4)

    async def main() -> None:
        async with directory_stack(data_dir) as st_:
            for cursor, rank in cursors:
                text = await st_.error(CALLER, "search", {"query": "x", "rank": rank, "cursor": cursor})
                assert text == f"search.cursor: not a nextCursor of a {rank!r} search", text
                assert not any(word in text for word in _PYTHON_WORDS), text

    anyio.run(main)
