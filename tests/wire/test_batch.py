"""Batch PMs (WIRE.md §Batches): the codec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brmcp import wire

PAYLOADS = st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=40)


@given(PAYLOADS)
def test_a_batch_splits_back_into_its_parts_in_order(payloads: list[bytes]) -> None:
    parts = [p for payload in payloads for p in wire.encode(payload, sid="ab12", exp=0, chunk_size=64)]
    parts = parts[: wire.MAX_BATCH_PARTS]
    text = wire.encode_batch(parts)
    assert len(text) == wire.batch_size(parts)
    assert wire.split_batch(text) == parts
    # Every line is an ordinary part.
    assert all(wire.parse(line) is not None for line in parts)


def test_a_v1_receiver_finds_no_part_in_a_batch() -> None:
    parts = wire.encode(b'{"jsonrpc":"2.0","id":1,"method":"ping"}', sid="ab12", exp=0) * 2
    text = wire.encode_batch(parts)
    # The Go reference and brmcp before batches apply the v1 predicate to
    # the whole text: not an envelope, so it is ignored as chat.
    assert wire.parse(text) is None
    assert not wire.is_envelope(text)


def test_ordinary_pms_and_chat_are_not_batches() -> None:
    part = wire.encode(b"{}", sid="ab12", exp=0)[0]
    assert wire.split_batch(part) is None
    assert wire.split_batch("hello --mcpb[v=1]--") is None
    assert wire.split_batch("--mcpb[v=2]--\n" + part) is None
    assert wire.split_batch("--mcpb[v=1]--x\n" + part) is None
    assert wire.split_batch("  --mcpb[v=1]--\r\n" + part + "\r\n\n") == [part + "\r"]
    assert wire.split_batch("--mcpb[v=1]--") == []


def test_lines_past_the_part_limit_are_dropped() -> None:
    part = wire.encode(b"{}", sid="ab12", exp=0)[0]
    text = "\n".join([wire.BATCH_TAG, *([part] * (wire.MAX_BATCH_PARTS + 50))])
    lines = wire.split_batch(text)
    assert lines is not None
    assert len(lines) == wire.MAX_BATCH_PARTS


def test_encode_batch_refuses_what_no_receiver_could_split() -> None:
    part = wire.encode(b"{}", sid="ab12", exp=0)[0]
    with pytest.raises(ValueError, match="at least one part"):
        wire.encode_batch([])
    with pytest.raises(ValueError, match="at most 256 parts"):
        wire.encode_batch([part] * (wire.MAX_BATCH_PARTS + 1))
    with pytest.raises(ValueError, match="one line"):
        wire.encode_batch([part + "\nx"])
