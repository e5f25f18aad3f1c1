"""Batch PMs a hostile peer builds (WIRE.md §Batches): the split is exactly
"lines at LF, blank ones skipped, the first 256 kept", whatever the text,
and costs one pass over it however many lines it has."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brmcp import wire

TAG = wire.BATCH_TAG


def reference_split(text: str) -> list[str] | None:
    """WIRE.md §Batches "Receiving", spelled out directly."""
    body = text.lstrip()
    if not body.startswith(TAG):
        return None
    rest = body[len(TAG) :]
    if rest and rest[0] not in "\r\n":
        return None
    return [line for line in rest.split("\n") if line.strip()][: wire.MAX_BATCH_PARTS]


#: Characters that matter to the split: line breaks, white space (ASCII,
#: Unicode, and the separators Python strips but Go does not), a part's.
_ALPHABET = st.sampled_from(
    ["\n", "\r", " ", "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u2028", "\u3000", "a", "-", "["]
)
_LINES = st.lists(
    st.one_of(st.text(_ALPHABET, max_size=12), st.sampled_from(["", " ", "\r", TAG, "x"])), max_size=300
)


@settings(max_examples=400, deadline=None)
@given(
    st.text(st.sampled_from(" \t\r\n\u3000\x1c"), max_size=4),
    st.sampled_from(["", "\n", "\r", "\r\n", " \n", "x", "\t"]),
    _LINES,
)
def test_the_split_is_the_reference_split(lead: str, after_tag: str, lines: list[str]) -> None:
    text = lead + TAG + after_tag + "\n".join(lines)
    expected = reference_split(text)
    assert wire.split_batch(text) == expected
    assert wire.is_batch(text) == (expected is not None)


@settings(max_examples=300, deadline=None)
@given(st.text(_ALPHABET, max_size=64))
def test_any_text_splits_as_the_reference(text: str) -> None:
    assert wire.split_batch(text) == reference_split(text)
    assert wire.split_batch(TAG + text) == reference_split(TAG + text)
    assert wire.is_batch(text) == (reference_split(text) is not None)


def test_only_the_lines_kept_are_cut_out_of_a_flood_of_blank_lines() -> None:
    # 1.8 MB of blank lines, then parts: the split holds the parts and not
    # a string per blank line.
    part = wire.encode(b"{}", sid="ab", exp=0)[0]
    text = TAG + "\n" * 1_800_000 + "\n".join([part] * 300)
    tracemalloc.start()
    try:
        lines = wire.split_batch(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [part] * wire.MAX_BATCH_PARTS
    # The list and its 256 strings (~100 bytes each), not 1.8 million entries.
    assert peak < 200_000, peak


@pytest.mark.parametrize(
    "body",
    [
        "\n" * 1_800_000,
        "\n" + " \t\r\n" * 450_000,
        "\nab" * 600_000,
        "\n" + " " * 1_800_000 + "x",
        "\n\u3000" * 900_000,
        ("\n" + TAG) * 130_000,
    ],
    ids=["blank", "white-space", "short", "long-white-space", "unicode-space", "tags"],
)
def test_large_hostile_batches_split_in_one_pass(body: str) -> None:
    text = TAG + body
    started = time.perf_counter()
    lines = wire.split_batch(text)
    elapsed = time.perf_counter() - started
    assert lines == reference_split(text)
    assert lines is not None
    assert len(lines) <= wire.MAX_BATCH_PARTS
    assert all("\n" not in line and line.strip() for line in lines)
    print(f"{elapsed / (len(text) / 2**20) * 1000:.2f} ms/MiB")


def test_is_batch_does_not_split() -> None:
    text = TAG + "\nab" * 600_000
    assert wire.is_batch(text)
    assert wire.is_batch(" \r\n" + TAG)
    assert not wire.is_batch(TAG + " ")
    assert not wire.is_batch("")
    assert not wire.is_batch(" " * 100)


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\r\n"])
def test_a_part_with_a_line_break_is_never_batched(bad: str) -> None:
    with pytest.raises(ValueError):
        wire.encode_batch(["--mcp[x]--QUJD", bad])


def test_encode_then_split_round_trips_at_the_part_bound() -> None:
    parts = [wire.encode(str(i).encode(), sid="ab", exp=0)[0] for i in range(wire.MAX_BATCH_PARTS)]
    text = wire.encode_batch(parts)
    assert len(text) == wire.batch_size(parts)
    assert wire.split_batch(text) == parts
    with pytest.raises(ValueError):
        wire.encode_batch([*parts, parts[0]])
    with pytest.raises(ValueError):
        wire.encode_batch([])
