"""One test per reassembly rule (WIRE.md §Reassembly, §Reassembly bounds),
plus the Go reference's assembler tests (karamble/brmcp, ``wire/wire_test.go``)."""

from __future__ import annotations

import pytest

from brmcp import wire
from brmcp.wire import Assembler, AssemblerConfig, Part


def part(seq: int, total: int, chunk: bytes, *, mid: str = "1", sid: str = "aa", exp: int = 0) -> Part:
    return Part(sid=sid, mid=mid, seq=seq, total=total, exp=exp, chunk=chunk)


def state(assembler: Assembler, *peers: str) -> tuple[int, int, tuple[int, ...]]:
    return assembler.pending_messages, assembler.buffered_bytes, tuple(assembler.pending(p) for p in peers)


# --- configuration -------------------------------------------------------------


def test_config_defaults() -> None:
    config = AssemblerConfig()
    assert (
        config.max_pending_per_peer,
        config.max_message_bytes,
        config.max_total_bytes,
        config.timeout,
    ) == (
        8,
        16 * 1024 * 1024,
        64 * 1024 * 1024,
        600.0,
    )
    assert Assembler().config == config


def test_non_positive_config_values_select_defaults() -> None:
    assembler = Assembler(AssemblerConfig(0, -1, 0, -5.0))
    assert assembler.config == AssemblerConfig()


# --- rule 1: expiry first, nothing touched --------------------------------------


def test_expired_part_is_refused_before_anything_else() -> None:
    assembler = Assembler(AssemblerConfig(max_pending_per_peer=1, timeout=10.0))
    assert assembler.add("p", part(1, 2, b"abcd", mid="1"), now=0.0) is None
    before = state(assembler, "p")
    # This new message would overflow the peer's cap, and at now=50 the GC
    # would evict mid 1 (timeout): the expiry check runs before both.
    with pytest.raises(wire.ExpiredError) as info:
        assembler.add("p", part(1, 2, b"zz", mid="2", exp=40), now=50.0)
    assert str(info.value) == "message deadline passed"
    assert state(assembler, "p") == before
    # An expired part of the pending message itself adds nothing either.
    with pytest.raises(wire.ExpiredError):
        assembler.add("p", part(2, 2, b"efgh", mid="1", exp=40), now=50.0)
    assert state(assembler, "p") == before


def test_expired_single_part_is_refused() -> None:
    with pytest.raises(wire.ExpiredError):
        Assembler().add("p", part(1, 1, b"x", exp=100), now=101.0)


# --- rule 2: single parts bypass all state --------------------------------------


def test_single_part_is_returned_at_once_without_state() -> None:
    assembler = Assembler()
    assert assembler.add("p", part(1, 1, b"hello"), now=0.0) == b"hello"
    assert state(assembler, "p") == (0, 0, (0,))


def test_repeated_single_part_is_delivered_again() -> None:
    assembler = Assembler()
    one = part(1, 1, b"again", mid="7")
    assert [assembler.add("p", one, now=0.0) for _ in range(3)] == [b"again"] * 3


def test_single_part_size_bound_is_strictly_greater() -> None:
    assembler = Assembler(AssemblerConfig(max_message_bytes=4))
    assert assembler.add("p", part(1, 1, b"four"), now=0.0) == b"four"
    with pytest.raises(wire.TooLargeError) as info:
        assembler.add("p", part(1, 1, b"fives"), now=0.0)
    assert str(info.value) == "message exceeds size bounds"


def test_single_part_ignores_pending_cap_global_bound_and_gc() -> None:
    assembler = Assembler(AssemblerConfig(max_pending_per_peer=1, max_total_bytes=4, timeout=1.0))
    assert assembler.add("p", part(1, 2, b"abcd", mid="1"), now=0.0) is None
    # At the cap, with the global budget used up and mid 1 past its timeout:
    assert assembler.add("p", part(1, 1, b"0123456789", mid="2"), now=5.0) == b"0123456789"
    # The single part ran no GC: mid 1 is still pending.
    assert state(assembler, "p") == (1, 4, (1,))


# --- rule 3/4: overflow is checked before state is created -----------------------


def test_overflow_is_refused_without_creating_state() -> None:
    assembler = Assembler(AssemblerConfig(max_pending_per_peer=2))
    assembler.add("p", part(1, 2, b"a", mid="1"), now=0.0)
    assembler.add("p", part(1, 2, b"b", mid="2"), now=0.0)
    before = state(assembler, "p")
    with pytest.raises(wire.BufferFullError) as info:
        assembler.add("p", part(1, 2, b"c", mid="3"), now=0.0)
    assert str(info.value) == "reassembly buffer full"
    assert state(assembler, "p") == before == (2, 2, (2,))
    # Parts of messages already pending are still accepted at the cap.
    assert assembler.add("p", part(2, 2, b"B", mid="2"), now=0.0) == b"bB"
    assert assembler.add("p", part(1, 2, b"c", mid="3"), now=0.0) is None


def test_same_mid_under_another_sid_is_another_message() -> None:
    assembler = Assembler(AssemblerConfig(max_pending_per_peer=1))
    assembler.add("p", part(1, 2, b"a", sid="aa", mid="1"), now=0.0)
    with pytest.raises(wire.BufferFullError):
        assembler.add("p", part(1, 2, b"a", sid="bb", mid="1"), now=0.0)


# --- rule 5: a total mismatch drops the whole message ---------------------------


def test_total_mismatch_drops_the_message() -> None:
    assembler = Assembler()
    assembler.add("p", part(1, 3, b"abc", sid="aa", mid="0f"), now=0.0)
    assembler.add("p", part(2, 3, b"def", sid="aa", mid="0f"), now=0.0)
    with pytest.raises(wire.PartCountError) as info:
        assembler.add("p", part(3, 4, b"ghi", sid="aa", mid="0f"), now=0.0)
    assert str(info.value) == "wire: inconsistent part count for p/aa/0f"
    assert info.value.key == "p/aa/0f"
    assert not isinstance(info.value, wire.TooLargeError | wire.BufferFullError | wire.ExpiredError)
    assert state(assembler, "p") == (0, 0, (0,))
    # The next part of that mid starts a fresh message with its own total.
    assert assembler.add("p", part(3, 4, b"ghi", sid="aa", mid="0f"), now=0.0) is None
    assert state(assembler, "p") == (1, 3, (1,))


def test_total_mismatch_is_checked_before_duplicate_seq() -> None:
    assembler = Assembler()
    assembler.add("p", part(1, 2, b"ab"), now=0.0)
    with pytest.raises(wire.PartCountError):
        assembler.add("p", part(1, 3, b"ab"), now=0.0)
    assert state(assembler, "p") == (0, 0, (0,))


# --- rule 6: duplicate seq ignored, first copy wins -----------------------------


def test_duplicate_seq_is_ignored_and_first_copy_wins() -> None:
    assembler = Assembler()
    assert assembler.add("p", part(1, 2, b"AAAA"), now=0.0) is None
    assert assembler.add("p", part(1, 2, b"BBBBBB"), now=0.0) is None
    assert state(assembler, "p") == (1, 4, (1,))
    assert assembler.add("p", part(2, 2, b"CC"), now=0.0) == b"AAAACC"
    assert state(assembler, "p") == (0, 0, (0,))


def test_duplicate_seq_is_checked_before_byte_bounds() -> None:
    assembler = Assembler(AssemblerConfig(max_message_bytes=6))
    assembler.add("p", part(1, 2, b"123456"), now=0.0)
    # A duplicate that would break the bound is simply ignored.
    assert assembler.add("p", part(1, 2, b"123456"), now=0.0) is None
    assert state(assembler, "p") == (1, 6, (1,))


# --- rule 7: byte bounds drop the message ---------------------------------------


def test_message_byte_bound_drops_the_message() -> None:
    assembler = Assembler(AssemblerConfig(max_message_bytes=8))
    assembler.add("p", part(1, 3, b"1234"), now=0.0)
    assembler.add("p", part(2, 3, b"5678"), now=0.0)  # exactly at the bound: fine
    with pytest.raises(wire.TooLargeError):
        assembler.add("p", part(3, 3, b"9"), now=0.0)
    assert state(assembler, "p") == (0, 0, (0,))


def test_global_byte_bound_drops_only_the_offending_message() -> None:
    assembler = Assembler(AssemblerConfig(max_total_bytes=10))
    assembler.add("a", part(1, 2, b"12345678"), now=0.0)
    with pytest.raises(wire.TooLargeError):
        assembler.add("b", part(1, 2, b"abc"), now=0.0)
    # b's state was created and dropped again; a is untouched.
    assert state(assembler, "a", "b") == (1, 8, (1, 0))
    assert assembler.add("b", part(1, 2, b"ab"), now=0.0) is None  # 8 + 2 == 10: fine
    assert assembler.buffered_bytes == 10


# --- rule 8: completion -------------------------------------------------------------


def test_completion_concatenates_in_seq_order_and_frees_state() -> None:
    assembler = Assembler()
    for seq in (3, 1, 4):
        assert assembler.add("p", part(seq, 4, bytes([48 + seq])), now=0.0) is None
    assert assembler.add("p", part(2, 4, b"2"), now=0.0) == b"1234"
    assert state(assembler, "p") == (0, 0, (0,))


def test_late_duplicate_after_completion_starts_a_fresh_message() -> None:
    assembler = Assembler()
    first, second = part(1, 2, b"ab"), part(2, 2, b"cd")
    assembler.add("p", first, now=0.0)
    assert assembler.add("p", second, now=0.0) == b"abcd"
    assert assembler.add("p", first, now=0.0) is None
    assert state(assembler, "p") == (1, 2, (1,))
    # A full re-delivery is delivered again: the wire has no message dedupe.
    assert assembler.add("p", second, now=0.0) == b"abcd"


# --- lazy GC ------------------------------------------------------------------------


def test_gc_evicts_by_the_first_seen_exp() -> None:
    assembler = Assembler()
    assembler.add("p", part(1, 2, b"ab", exp=100), now=50.0)
    # Second part carries a later exp; at 100.9 the first-seen exp (100) has
    # not passed (floor(100.9) == 100): the message completes.
    assert assembler.add("p", part(2, 2, b"cd", exp=200), now=100.9) == b"abcd"
    assembler.add("p", part(1, 2, b"ab", exp=100), now=50.0)
    # At 101 the first-seen exp passed: GC drops the message, the part
    # (itself live until 200) starts a fresh one.
    assert assembler.add("p", part(2, 2, b"cd", exp=200), now=101.0) is None
    assert state(assembler, "p") == (1, 2, (1,))


def test_gc_timeout_is_strictly_greater() -> None:
    assembler = Assembler(AssemblerConfig(timeout=10.0))
    assembler.add("p", part(1, 2, b"ab"), now=0.0)
    assert assembler.add("p", part(2, 2, b"cd"), now=10.0) == b"abcd"  # age == timeout: kept
    assembler.add("p", part(1, 2, b"ab"), now=0.0)
    assert assembler.add("p", part(2, 2, b"cd"), now=10.5) is None  # age > timeout: fresh message
    assert state(assembler, "p") == (1, 2, (1,))


def test_gc_runs_on_multi_part_adds_for_every_peer() -> None:
    assembler = Assembler(AssemblerConfig(timeout=1.0))
    assembler.add("a", part(1, 2, b"stale"), now=0.0)
    assembler.add("a", part(1, 1, b"single"), now=5.0)  # bypass: no GC
    assert state(assembler, "a") == (1, 5, (1,))
    assembler.add("b", part(1, 2, b"x", mid="9"), now=5.0)  # another peer's multi-part add
    assert state(assembler, "a", "b") == (1, 1, (0, 1))


def test_gc_frees_the_per_peer_slot() -> None:
    assembler = Assembler(AssemblerConfig(max_pending_per_peer=1, timeout=1.0))
    assembler.add("p", part(1, 2, b"a", mid="1"), now=0.0)
    with pytest.raises(wire.BufferFullError):
        assembler.add("p", part(1, 2, b"b", mid="2"), now=0.5)
    assert assembler.add("p", part(1, 2, b"b", mid="2"), now=2.0) is None
    assert state(assembler, "p") == (1, 1, (1,))


def test_gc_handles_huge_exp_exactly() -> None:
    assembler = Assembler(AssemblerConfig(timeout=1e30))
    huge = 2**62 + 1  # not representable as a float
    assembler.add("p", part(1, 2, b"ab", exp=huge), now=float(2**62))
    assert assembler.add("p", part(2, 2, b"cd", exp=huge), now=float(2**62)) == b"abcd"


def test_many_finished_messages_do_not_grow_the_gc_index() -> None:
    assembler = Assembler()
    for n in range(5000):
        mid = format(n, "x")
        assembler.add("p", part(1, 2, b"a", mid=mid, exp=10**9), now=float(n))
        assert assembler.add("p", part(2, 2, b"b", mid=mid, exp=10**9), now=float(n)) == b"ab"
    assert assembler.pending_messages == 0
    assert len(assembler._deadlines) <= 4 * 1 + 64 + 2  # stale entries are compacted


# --- per-peer isolation -------------------------------------------------------------


def test_peers_are_isolated() -> None:
    assembler = Assembler(AssemblerConfig(max_pending_per_peer=1))
    assembler.add("a", part(1, 2, b"a1"), now=0.0)
    with pytest.raises(wire.BufferFullError):
        assembler.add("a", part(1, 2, b"a2", mid="2"), now=0.0)
    # Same sid and mid from another peer is a different message.
    assert assembler.add("b", part(1, 2, b"b1"), now=0.0) is None
    assert assembler.add("b", part(2, 2, b"b2"), now=0.0) == b"b1b2"
    assert assembler.add("a", part(2, 2, b"a2"), now=0.0) == b"a1a2"


def test_clear_peer_drops_only_that_peer() -> None:
    assembler = Assembler()
    assembler.add("a", part(1, 2, b"aa"), now=0.0)
    assembler.add("a", part(1, 2, b"aa", mid="2"), now=0.0)
    assembler.add("b", part(1, 2, b"bbb"), now=0.0)
    assembler.clear_peer("a")
    assert state(assembler, "a", "b") == (1, 3, (0, 1))


# --- the Go reference's wire tests (karamble/brmcp, wire/wire_test.go) ---------------


def test_go_pending_per_peer_bound() -> None:
    assembler = Assembler(AssemblerConfig(max_pending_per_peer=2))
    assembler.add("peer", part(1, 2, b"x", mid="1"), now=0.0)
    assembler.add("peer", part(1, 2, b"x", mid="2"), now=0.0)
    with pytest.raises(wire.BufferFullError):
        assembler.add("peer", part(1, 2, b"x", mid="3"), now=0.0)
    assert assembler.add("other", part(1, 2, b"x", mid="3"), now=0.0) is None


def test_go_message_bytes_bound() -> None:
    assembler = Assembler(AssemblerConfig(max_message_bytes=6))
    assert assembler.add("peer", part(1, 2, b"1234"), now=0.0) is None
    with pytest.raises(wire.TooLargeError):
        assembler.add("peer", part(2, 2, b"5678"), now=0.0)
    with pytest.raises(wire.TooLargeError):
        assembler.add("peer", part(1, 1, b"12345678"), now=0.0)


def test_go_timeout_gc() -> None:
    assembler = Assembler(AssemblerConfig(timeout=1.0))
    assert assembler.add("peer", part(1, 2, b"ab"), now=1000.0) is None
    assert assembler.add("peer", part(2, 2, b"cd"), now=1002.0) is None
    assert assembler.pending_messages == 1


def test_go_duplicate_part_ignored() -> None:
    assembler = Assembler()
    assert assembler.add("peer", part(1, 2, b"ab"), now=0.0) is None
    assert assembler.add("peer", part(1, 2, b"ab"), now=0.0) is None
    assert assembler.add("peer", part(2, 2, b"cd"), now=0.0) == b"abcd"


def test_go_expired_part_dropped() -> None:
    now = 1_783_000_000.0
    with pytest.raises(wire.ExpiredError):
        Assembler().add("peer", part(1, 1, b"x", exp=int(now) - 60), now=now)


def _held_after(feed: object) -> int:
    """Bytes still allocated (tracemalloc) after ``feed()`` ran and its results were dropped."""
    import gc
    import tracemalloc

    tracemalloc.start()
    try:
        assert callable(feed)
        feed()
        gc.collect()
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return current


def test_completed_and_dropped_messages_release_their_chunks_at_once() -> None:
    """A deadline heap must not keep finished messages' chunks referenced
    (100 completed 4 MiB messages once held ~272 MiB): bytes held are bytes counted."""
    chunk = 256 * 1024
    asm = Assembler(AssemblerConfig(max_total_bytes=64 << 20))
    now = 1_000.0

    def complete() -> None:
        for i in range(40):  # 40 x 1 MiB, each in 4 parts, deadlines set
            for seq in range(1, 5):
                out = asm.add("p", part(seq, 4, bytes(chunk), mid=f"c{i}", exp=2_000), now)
            assert out is not None
            assert len(out) == 4 * chunk

    def dropped() -> None:
        for i in range(40):  # 40 messages dropped half-way (total disagrees)
            asm.add("p", part(1, 4, bytes(chunk), mid=f"d{i}", exp=2_000), now)
            asm.add("p", part(2, 4, bytes(chunk), mid=f"d{i}", exp=2_000), now)
            with pytest.raises(wire.PartCountError):
                asm.add("p", part(3, 5, bytes(chunk), mid=f"d{i}", exp=2_000), now)
        for i in range(8):  # and 8 cleared by clear_peer
            asm.add("q", part(1, 4, bytes(chunk), mid=f"q{i}", exp=2_000), now)
        asm.clear_peer("q")

    for feed in (complete, dropped):
        held = _held_after(feed)
        assert asm.buffered_bytes == 0
        assert asm.pending_messages == 0
        assert held < 2 << 20, f"{held} bytes still referenced after {feed.__name__}"
