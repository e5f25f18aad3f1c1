"""Hypothesis properties of the envelope codec and the assembler (WIRE.md
§Parsing, §Chunking, §Reassembly, §Reassembly bounds)."""

from __future__ import annotations

import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp import wire

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

hex_ids = st.text(alphabet="0123456789abcdef", min_size=1, max_size=32)
exps = st.one_of(st.just(0), st.integers(-(2**63), 2**63 - 1), st.integers(1_700_000_000, 1_900_000_000))
_ID = re.compile(r"[0-9a-f]{1,32}")


def _check_part(part: wire.Part) -> None:
    """Invariants of every Part that parse returns."""
    assert type(part) is wire.Part
    assert _ID.fullmatch(part.sid)
    assert _ID.fullmatch(part.mid)
    assert 1 <= part.seq <= part.total <= wire.MAX_PARTS
    assert -(2**63) <= part.exp <= 2**63 - 1
    assert type(part.chunk) is bytes
    assert len(part.chunk) > 0


@SETTINGS
@given(
    payload=st.binary(min_size=1, max_size=2000),
    sid=hex_ids,
    mid=st.one_of(st.none(), hex_ids),
    exp=exps,
    chunk_size=st.one_of(st.integers(-5, 0), st.integers(1, 700), st.just(wire.DEFAULT_CHUNK_SIZE)),
)
def test_encode_then_parse_round_trips(
    payload: bytes, sid: str, mid: str | None, exp: int, chunk_size: int
) -> None:
    effective = chunk_size if chunk_size > 0 else wire.DEFAULT_CHUNK_SIZE
    if -(-len(payload) // effective) > wire.MAX_PARTS:
        chunk_size = effective = -(-len(payload) // wire.MAX_PARTS)  # keep the case encodable
    texts = wire.encode(payload, sid=sid, mid=mid, exp=exp, chunk_size=chunk_size)
    total = -(-len(payload) // effective)
    assert len(texts) == total
    parts = [wire.parse(text) for text in texts]
    mids = set()
    for index, part in enumerate(parts):
        assert part is not None
        _check_part(part)
        assert (part.sid, part.seq, part.total, part.exp) == (sid, index + 1, total, exp)
        # Chunk boundaries fall on raw byte offsets (WIRE.md §Chunking).
        assert part.chunk == payload[index * effective : (index + 1) * effective]
        mids.add(part.mid)
    assert len(mids) == 1
    if mid is not None:
        assert mids == {mid}
    assembler = wire.Assembler()
    out = [assembler.add("peer", part, now=0.0) for part in parts if part is not None]
    assert out[-1] == payload
    assert all(o is None for o in out[:-1])
    assert assembler.pending_messages == 0
    assert assembler.buffered_bytes == 0


@st.composite
def arrivals(draw: st.DrawFn) -> tuple[bytes, int, list[int]]:
    """A payload, a chunk size, and an arrival order over part indexes in
    which every part appears at least once and some appear repeatedly."""
    payload = draw(st.binary(min_size=2, max_size=400))
    chunk_size = draw(st.integers(1, max(1, len(payload) // 2)))
    total = -(-len(payload) // chunk_size)
    if total > wire.MAX_PARTS:
        chunk_size = -(-len(payload) // wire.MAX_PARTS)
        total = -(-len(payload) // chunk_size)
    order = list(draw(st.permutations(range(total))))
    for _ in range(draw(st.integers(0, 2 * total))):
        order.insert(draw(st.integers(0, len(order))), draw(st.integers(0, total - 1)))
    return payload, chunk_size, order


@SETTINGS
@given(arrivals())
def test_any_order_with_duplicates_reassembles(case: tuple[bytes, int, list[int]]) -> None:
    payload, chunk_size, order = case
    parts = [wire.parse(t) for t in wire.encode(payload, sid="ab", exp=0, chunk_size=chunk_size)]
    assembler = wire.Assembler()
    seen: set[int] = set()
    completed_at = None
    for step, index in enumerate(order):
        part = parts[index]
        assert part is not None
        out = assembler.add("peer", part, now=1.0)
        if completed_at is None:
            seen.add(index)
            if len(seen) == len(parts):
                # The message completes exactly when its last missing part arrives.
                assert out == payload
                completed_at = step
            else:
                assert out is None
        elif out is not None:
            # Late duplicates start a fresh message; a full re-delivery is
            # delivered again, and always as the same bytes.
            assert out == payload
    assert completed_at is not None


@SETTINGS
@given(st.text())
def test_parse_never_raises_on_any_text(text: str) -> None:
    for candidate in (text, "--mcp[" + text, text + "]--QUJD", "--mcp[v=1,sid=a,mid=b,seq=1/1]--" + text):
        part = wire.parse(candidate)
        if part is not None:
            _check_part(part)
        assert wire.is_envelope(candidate) is (part is not None)


@SETTINGS
@given(
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8),
    st.integers(1, 200_000),
    st.sampled_from(["", "--mcp[", "--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=0]--", "  --mcp[v=1,", "\u3000"]),
    st.sampled_from(["", "]--QUJD", "]--", "QUJD", "\n"]),
)
def test_parse_never_raises_on_huge_repetitive_text(unit: str, count: int, head: str, tail: str) -> None:
    text = head + unit * count + tail
    part = wire.parse(text)
    if part is not None:
        _check_part(part)


@SETTINGS
@given(
    st.text(alphabet=st.characters(min_codepoint=0x80), max_size=50),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=50),
)
def test_parse_never_raises_on_non_ascii(a: str, b: str) -> None:
    for text in (
        a,
        b,
        "--mcp[" + a + "]--" + b,
        "--mcp[v=1,sid=aa,mid=bb,seq=1/1," + a + "]--QUJD",
        "\u2028" + b,
    ):
        part = wire.parse(text)
        if part is not None:
            _check_part(part)


def test_parse_accepts_lone_surrogates_without_raising() -> None:
    # Python strings can hold lone surrogates (e.g. from surrogateescape);
    # they are never valid envelope characters but must not raise.
    assert wire.parse("--mcp[v=1,sid=aa,mid=bb,seq=1/1]--QUJD\udcff") is None
    part = wire.parse("--mcp[x=\udcff,v=1,sid=aa,mid=bb,seq=1/1]--QUJD")
    assert part is not None
    assert part.chunk == b"ABC"


# --- assembler bounds under adversarial input --------------------------------


def _adversarial_ops(rnd: random.Random, count: int) -> list[tuple[str, wire.Part, float]]:
    """Random parts from many peers: random totals (sometimes contradicting
    earlier parts of the same mid), random deadlines around random clocks."""
    ops = []
    for _ in range(count):
        total = rnd.randint(1, wire.MAX_PARTS) if rnd.random() < 0.5 else rnd.randint(1, 4)
        exp = rnd.choice([0, 0, rnd.randint(-10, 1100), rnd.randint(-(2**63), 2**63 - 1)])
        part = wire.Part(
            sid=rnd.choice("abc"),
            mid=rnd.choice("123456"),
            seq=rnd.randint(1, total),
            total=total,
            exp=exp,
            chunk=b"x" * rnd.randint(1, 40),
        )
        now = rnd.uniform(0, 1200) if rnd.random() < 0.7 else float(rnd.randint(-100, 1200))
        ops.append((f"peer{rnd.randint(0, 9)}", part, now))
    return ops


@settings(max_examples=300, deadline=None)
@given(
    config=st.builds(
        wire.AssemblerConfig,
        max_pending_per_peer=st.integers(1, 4),
        max_message_bytes=st.integers(1, 64),
        max_total_bytes=st.integers(1, 128),
        timeout=st.floats(0.5, 100.0),
    ),
    seed=st.integers(0, 2**32),
)
def test_assembler_counters_stay_within_bounds(config: wire.AssemblerConfig, seed: int) -> None:
    assembler = wire.Assembler(config)
    ops = _adversarial_ops(random.Random(seed), 200)
    peers = {peer for peer, _, _ in ops}
    for peer, part, now in ops:
        before = assembler.buffered_bytes
        try:
            out = assembler.add(peer, part, now)
        except wire.WireError:
            out = None
        if out is not None:
            assert len(out) <= config.max_message_bytes
        assert 0 <= assembler.buffered_bytes <= config.max_total_bytes
        assert assembler.buffered_bytes <= before + len(part.chunk)
        per_peer = [assembler.pending(p) for p in peers]
        assert all(0 <= n <= config.max_pending_per_peer for n in per_peer)
        assert sum(per_peer) == assembler.pending_messages
        assert assembler.pending_messages <= len(peers) * config.max_pending_per_peer
