"""Focused tests of parse, encode and the deadline rule (WIRE.md §Grammar,
§Parsing, §Chunking, §Identifiers, §Deadlines), including the Go
reference's wire tests (karamble/brmcp, ``wire/wire_test.go``)."""

from __future__ import annotations

import base64
import dataclasses
import math
import os
import re
import time

import pytest

import brmcp
from brmcp import wire

H = "--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=0]--"


def fields(text: str) -> tuple[object, ...] | None:
    part = wire.parse(text)
    return None if part is None else (part.sid, part.mid, part.seq, part.total, part.exp, part.chunk)


# --- identifiers ---------------------------------------------------------------------


def test_new_id_is_16_lowercase_hex_and_fresh() -> None:
    ids = {wire.new_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_does_not_reuse_the_parents_ids() -> None:
    wire.new_id()  # make sure the parent holds a batch of unused ids
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.write(write_end, "".join(wire.new_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    child = os.read(read_end, 64).decode()
    os.close(read_end)
    parent = "".join(wire.new_id() for _ in range(4))
    assert len(child) == len(parent) == 64
    assert {child[i : i + 16] for i in range(0, 64, 16)}.isdisjoint(
        parent[i : i + 16] for i in range(0, 64, 16)
    )


def test_constants() -> None:
    assert (wire.VERSION, wire.DEFAULT_CHUNK_SIZE, wire.MAX_PARTS) == (1, 204800, 64)


def test_is_envelope_is_reexported() -> None:
    assert brmcp.is_envelope is wire.is_envelope


def test_part_is_frozen_and_parse_builds_equal_parts() -> None:
    part = wire.parse(H + "QUJD")
    assert part == wire.Part("aa", "bb", 1, 1, 0, b"ABC")
    assert hash(part) == hash(wire.Part("aa", "bb", 1, 1, 0, b"ABC"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        part.sid = "cc"  # type: ignore[misc]


# --- parsing rules, one example each (WIRE.md §Parsing) ------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Rule 1: Go's TrimSpace set, and nothing else.
        ("\u3000\u0085 " + H + "QUJD\u2029\t", ("aa", "bb", 1, 1, 0, b"ABC")),
        ("\x1c" + H + "QUJD", None),  # Python's strip() would remove U+001C
        (H + "QUJD\x1f", None),
        ("\u200b" + H + "QUJD", None),  # zero-width space is not White_Space
        ("\ufeff" + H + "QUJD", None),  # nor is a byte order mark
        # Rule 2: whole-body match; the header may hold '[' and newlines.
        ("--mcp[x=[\n],v=1,sid=aa,mid=bb,seq=1/1]--QUJD", None),  # header ends at the first ']'
        ("--mcp[x=[\n,v=1,sid=aa,mid=bb,seq=1/1]--QUJD", ("aa", "bb", 1, 1, 0, b"ABC")),
        (H + "QUJD\n\n", ("aa", "bb", 1, 1, 0, b"ABC")),  # trailing newlines are trimmed, not a '$' trap
        (H + "QUJD]", None),
        # Rule 3: items split on ',', key at the first '='; last duplicate wins.
        ("--mcp[v=1,sid=aa,sid=cc,mid=bb,seq=1/1]--QUJD", ("cc", "bb", 1, 1, 0, b"ABC")),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,seq=2/3,exp=5,exp=-7]--QUJD", ("aa", "bb", 2, 3, -7, b"ABC")),
        ("--mcp[v=2,v=1,sid=aa,mid=bb,seq=1/1]--QUJD", ("aa", "bb", 1, 1, 0, b"ABC")),
        ("--mcp[v=1,v=2,sid=aa,mid=bb,seq=1/1]--QUJD", None),
        # ... but every occurrence of a known key must be valid.
        ("--mcp[v=1,sid=ZZ,sid=aa,mid=bb,seq=1/1]--QUJD", None),
        ("--mcp[exp=1.5,v=1,sid=aa,mid=bb,seq=1/1,exp=0]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb,seq=9/9/9,seq=1/1]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,,]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,flag]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,x==]--QUJD", ("aa", "bb", 1, 1, 0, b"ABC")),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,=x]--QUJD", ("aa", "bb", 1, 1, 0, b"ABC")),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,Exp=nope, exp=x,exp =y]--QUJD", ("aa", "bb", 1, 1, 0, b"ABC")),
        # Rule 4: ids are 1-32 lowercase hex.
        ("--mcp[v=1,sid=,mid=bb,seq=1/1]--QUJD", None),
        ("--mcp[v=1,sid=aa\n,mid=bb,seq=1/1]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bB,seq=1/1]--QUJD", None),
        # Rule 5: Go ParseInt, not Python int().
        ("--mcp[v=+1,sid=aa,mid=bb,seq=+1/+2,exp=-0]--QUJD", ("aa", "bb", 1, 2, 0, b"ABC")),
        (
            "--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=9223372036854775807]--QUJD",
            ("aa", "bb", 1, 1, 2**63 - 1, b"ABC"),
        ),
        (
            "--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=-9223372036854775808]--QUJD",
            ("aa", "bb", 1, 1, -(2**63), b"ABC"),
        ),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=9223372036854775808]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=" + "0" * 5000 + "7]--QUJD", ("aa", "bb", 1, 1, 7, b"ABC")),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=1_000]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp= 1]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=\u0661]--QUJD", None),  # Arabic-Indic digit
        ("--mcp[v=1,sid=aa,mid=bb,seq=\uff11/1]--QUJD", None),  # fullwidth digit
        # Rule 6: version, presence and seq range.
        ("--mcp[sid=aa,mid=bb,seq=1/1]--QUJD", None),
        ("--mcp[v=1,mid=bb,seq=1/1]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb]--QUJD", None),
        ("--mcp[v=1,sid=aa,mid=bb,seq=64/64]--QUJD", ("aa", "bb", 64, 64, 0, b"ABC")),
        ("--mcp[v=1,sid=aa,mid=bb,seq=-1/1]--QUJD", None),
        # Rule 7: body whitespace is [\t\n\f\r ] only; padded quanta; non-empty.
        (H + "Q\tU\fJ\rD \n", ("aa", "bb", 1, 1, 0, b"ABC")),
        (H + "QU\vJD", None),
        (H + "QU\u00a0JD", None),
        (H + "QUJD=", None),
        (H + "QUJD====", None),
        (H + "QQ=\n=", ("aa", "bb", 1, 1, 0, b"A")),
        (H + "QQ", None),
        (H + "QUJD-_", None),
        (H + " \t ", None),
    ],
)
def test_parsing_rules(text: str, expected: tuple[object, ...] | None) -> None:
    assert fields(text) == expected
    assert wire.is_envelope(text) is (expected is not None)


def test_go_parse_rejects_non_envelope() -> None:
    rejects = [
        "hello there",
        "> **nick:** quoted chat",
        "--embed[type=image/png,data=AAAA]--",
        "--mcp[v=1,sid=zz,mid=aa,seq=1/1,exp=0]--QUJD",
        "--mcp[v=2,sid=aa,mid=bb,seq=1/1,exp=0]--QUJD",
        "--mcp[v=1,sid=aa,mid=bb,seq=2/1,exp=0]--QUJD",
        "--mcp[v=1,sid=aa,mid=bb,seq=1/999,exp=0]--QUJD",
        "--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=0]--not!base64",
        "--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=0]--QUJD--mcp[]--QQ",
        "--mcp[v=1,sid=aa,seq=1/1,exp=0]--QUJD",
    ]
    for text in rejects:
        assert wire.parse(text) is None, text
        assert not wire.is_envelope(text)


def test_human_chat_is_not_an_envelope() -> None:
    for text in [
        "hey bot, how are you?",
        "> **nick:** quoted chat\n\nreply",
        "--embed[type=image/png,data=QUJD]--",
        "",
    ]:
        assert not wire.is_envelope(text)


# --- encoding and chunking (WIRE.md §Chunking) -----------------------------------------


def test_go_single_part_round_trip() -> None:
    payload = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
    parts = wire.encode(payload, sid="a1b2c3d4e5f60718", mid="00112233aabbccdd")
    assert parts == [
        "--mcp[v=1,sid=a1b2c3d4e5f60718,mid=00112233aabbccdd,seq=1/1,exp=0]--"
        "eyJqc29ucnBjIjoiMi4wIiwiaWQiOjEsIm1ldGhvZCI6InRvb2xzL2xpc3QifQ=="
    ]
    part = wire.parse(parts[0])
    assert part is not None
    assert (part.sid, part.seq, part.total, part.exp) == ("a1b2c3d4e5f60718", 1, 1, 0)
    assert wire.Assembler().add("peer", part, now=time.time()) == payload


def test_go_chunked_round_trip_out_of_order() -> None:
    payload = b"0123456789abcdef" * 1024
    texts = wire.encode(payload, sid="aa", chunk_size=4096)
    assert len(texts) == 4
    assert all(len(t.split("]--", 1)[1]) == 5464 for t in texts)
    assembler = wire.Assembler()
    results = []
    for index in (2, 0, 3, 1):
        part = wire.parse(texts[index])
        assert part is not None
        results.append(assembler.add("peer", part, now=time.time()))
    assert results[:3] == [None, None, None]
    assert results[3] == payload


def test_encode_emits_fixed_key_order_and_always_exp() -> None:
    texts = wire.encode(b"12345678", sid="aa", mid="0f0f0f0f0f0f0f0f", exp=1783000600, chunk_size=4)
    assert texts == [
        "--mcp[v=1,sid=aa,mid=0f0f0f0f0f0f0f0f,seq=1/2,exp=1783000600]--MTIzNA==",
        "--mcp[v=1,sid=aa,mid=0f0f0f0f0f0f0f0f,seq=2/2,exp=1783000600]--NTY3OA==",
    ]
    assert wire.encode(b"x", sid="aa", mid="bb") == ["--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=0]--eA=="]
    assert wire.encode(b"x", sid="aa", mid="bb", exp=-3) == ["--mcp[v=1,sid=aa,mid=bb,seq=1/1,exp=-3]--eA=="]


def test_chunks_split_raw_bytes_and_pad_each_chunk() -> None:
    payload = "héllo wörld".encode()  # multi-byte UTF-8 split mid-character
    texts = wire.encode(payload, sid="aa", mid="bb", chunk_size=5)
    bodies = [t.split("]--", 1)[1] for t in texts]
    assert [base64.b64decode(b) for b in bodies] == [payload[i : i + 5] for i in range(0, len(payload), 5)]
    # Each chunk is encoded on its own, padding included (5 bytes -> one '=').
    assert bodies == [base64.b64encode(payload[i : i + 5]).decode() for i in range(0, len(payload), 5)]
    assert bodies[0].endswith("=")
    assert bodies[1].endswith("=")


def test_each_encode_call_uses_one_fresh_mid() -> None:
    first = {wire.parse(t).mid for t in wire.encode(b"x" * 10, sid="aa", chunk_size=3)}  # type: ignore[union-attr]
    second = {wire.parse(t).mid for t in wire.encode(b"x" * 10, sid="aa", chunk_size=3)}  # type: ignore[union-attr]
    assert len(first) == len(second) == 1
    assert first != second
    assert re.fullmatch(r"[0-9a-f]{16}", first.pop())


def test_non_positive_chunk_size_selects_default() -> None:
    payload = b"z" * (wire.DEFAULT_CHUNK_SIZE + 1)
    assert len(wire.encode(payload, sid="aa", chunk_size=0)) == 2
    assert len(wire.encode(payload, sid="aa", chunk_size=-1)) == 2


def test_go_encode_bounds() -> None:
    with pytest.raises(wire.WireError) as info:
        wire.encode(b"x", sid="NOT-HEX")
    assert str(info.value) == 'wire: invalid sid "NOT-HEX"'
    with pytest.raises(wire.WireError) as info:
        wire.encode(b"", sid="aa")
    assert str(info.value) == "wire: empty payload"
    assert not isinstance(info.value, wire.TooLargeError)
    assert len(wire.encode(b"x" * 64, sid="aa", chunk_size=1)) == 64
    with pytest.raises(wire.TooLargeError):
        wire.encode(b"x" * 65, sid="aa", chunk_size=1)
    with pytest.raises(wire.TooLargeError):
        wire.encode(b"x" * (64 * wire.DEFAULT_CHUNK_SIZE + 1), sid="aa")


@pytest.mark.parametrize("bad", ["", "AA", "a" * 33, "aa\n", " aa", "g", None, 12])
def test_encode_rejects_bad_ids(bad: object) -> None:
    with pytest.raises(wire.WireError, match="wire: invalid sid"):
        wire.encode(b"x", sid=bad)  # type: ignore[arg-type]
    if bad is None:
        return  # mid=None asks for a fresh mid
    with pytest.raises(wire.WireError, match="wire: invalid mid"):
        wire.encode(b"x", sid="aa", mid=bad)  # type: ignore[arg-type]


def test_encode_error_quotes_like_go() -> None:
    with pytest.raises(wire.WireError) as info:
        wire.encode(b"x", sid='a"b\\c\n\x01')
    assert str(info.value) == 'wire: invalid sid "a\\"b\\\\c\\n\\x01"'


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, True, 1.5, "1"])
def test_encode_rejects_invalid_exp(bad: object) -> None:
    with pytest.raises(wire.WireError, match="wire: invalid exp"):
        wire.encode(b"x", sid="aa", exp=bad)  # type: ignore[arg-type]


def test_encode_accepts_bytes_like_payloads() -> None:
    for payload in (bytearray(b"abcdef"), memoryview(b"abcdef")):
        texts = wire.encode(payload, sid="aa", mid="bb", chunk_size=4)  # type: ignore[arg-type]
        assert [wire.parse(t).chunk for t in texts] == [b"abcd", b"ef"]  # type: ignore[union-attr]


# --- deadlines (WIRE.md §Deadlines) ------------------------------------------------------


def test_part_expired_boundary() -> None:
    part = wire.Part("aa", "bb", 1, 1, 1000, b"x")
    assert not part.expired(999.0)
    assert not part.expired(1000.0)
    assert not part.expired(1000.999)
    assert part.expired(1001.0)
    assert part.expired(math.inf)
    assert not part.expired(math.nan)


def test_non_positive_exp_never_expires() -> None:
    for exp in (0, -1, -(2**63)):
        assert not wire.Part("aa", "bb", 1, 1, exp, b"x").expired(1e18)


def test_go_encode_sets_deadline() -> None:
    deadline = time.time() + 90.5
    exp = math.floor(deadline)
    text = wire.encode(b"payload", sid="aa", exp=exp)[0]
    assert f"exp={exp}]" in text
    part = wire.parse(text)
    assert part is not None
    assert part.exp == exp
    assert not part.expired(deadline - 1)
    assert not part.expired(deadline)
    assert part.expired(deadline + 1)
