"""Huge hostile PM bodies: ``parse`` returns None (or a Part when the text
really is an envelope) without raising and with bounded extra memory
(WIRE.md §Parsing). Timing is left to bench/wire_bench.py; these tests only
bound memory, measured with tracemalloc, at under 4x the input's size."""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable

import pytest

from brmcp import wire

MIB = 1 << 20
SIZE = 50 * MIB
HEADER = "--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=0]--"


def _repeat(unit: str, size: int = SIZE) -> str:
    return unit * (size // len(unit))


# Each builder returns (text, parse is expected to accept it).
CASES: dict[str, Callable[[], tuple[str, bool]]] = {
    "junk": lambda: (_repeat("x"), False),
    "junk-non-ascii": lambda: (_repeat("\u00e9\u4e2d"), False),
    "whitespace-only": lambda: (_repeat(" \n\u3000"), False),
    "tag-then-commas-and-equals-no-close": lambda: ("--mcp[" + _repeat(",="), False),
    "tag-then-equals-header-valid-body": lambda: ("--mcp[" + _repeat("=") + "]--QUJD", False),
    "tag-then-empty-items": lambda: ("--mcp[" + _repeat(",") + "]--QUJD", False),
    "many-unknown-items-bad-body": lambda: (
        "--mcp[" + _repeat("a=,") + "v=1,sid=aa,mid=bb,seq=1/1]--!",
        False,
    ),
    "many-unknown-items-wrong-version": lambda: (
        "--mcp[" + _repeat("a=,") + "v=2,sid=aa,mid=bb,seq=1/1]--QUJD",
        False,
    ),
    "many-valid-duplicates-then-bad": lambda: (
        "--mcp[" + _repeat("v=1,") + "v=x,sid=aa,mid=bb,seq=1/1]--QUJD",
        False,
    ),
    "huge-integer": lambda: ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=" + _repeat("9") + "]--QUJD", False),
    "huge-zero-padded-integer": lambda: (
        "--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=" + _repeat("0") + "5]--QUJD",
        True,
    ),
    "valid-header-huge-invalid-body": lambda: (HEADER + _repeat("QUJD") + "!", False),
    "valid-header-huge-body-bad-padding": lambda: (HEADER + _repeat("QUJD") + "QUJD=", False),
    "valid-header-huge-spaced-body-invalid": lambda: (HEADER + _repeat("QUJD \r\n") + "\vQUJD", False),
    "valid-header-huge-non-ascii-body": lambda: (HEADER + _repeat("QUJ\u00e9"), False),
    "huge-surrounding-whitespace": lambda: (
        _repeat(" ", SIZE // 2) + HEADER + "QUJD" + _repeat("\t", SIZE // 2),
        True,
    ),
    "valid-header-huge-valid-body": lambda: (HEADER + _repeat("QUJD"), True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_huge_input_is_handled_with_bounded_memory(name: str) -> None:
    text, accepted = CASES[name]()
    size = sys.getsizeof(text)
    tracemalloc.start()
    try:
        part = wire.parse(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (part is not None) is accepted
    assert peak < 4 * size, f"peak {peak / size:.2f}x the input"
    if part is not None:
        assert part.chunk[:3] == b"ABC"


def test_is_envelope_on_huge_chat_returns_false() -> None:
    assert not wire.is_envelope(_repeat("lol "))
