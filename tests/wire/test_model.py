"""Exactness: ``wire.parse`` and ``wire.Assembler`` against the literal Go
model in tests/kit/gomodel.py, on generated strings that sit close to the
grammar (WIRE.md §Parsing, §Reassembly). Any disagreement is a bug in one of them."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp import wire
from tests.kit.gomodel import (
    GO_TRIM_SET,
    ModelAssembler,
    ModelError,
    ModelPart,
    go_std_base64_decode,
    model_parse,
)
from tests.kit.paths import VECTORS as VECTOR_DIR

VECTORS: dict[str, Any] = json.loads((VECTOR_DIR / "wire-v1.json").read_text())

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _as_tuple(part: wire.Part | ModelPart | None) -> tuple[object, ...] | None:
    if part is None:
        return None
    return (part.sid, part.mid, part.seq, part.total, part.exp, part.chunk)


def _agree(text: str) -> None:
    expected = _as_tuple(model_parse(text))
    got = _as_tuple(wire.parse(text))
    assert got == expected, f"parse disagrees with the Go model on {text!r}"
    assert wire.is_envelope(text) is (expected is not None)


# --- the model itself is checked against the shared vectors ----------------


@pytest.mark.parametrize("vector", VECTORS["parse"], ids=lambda v: v["name"])
def test_model_agrees_with_vectors(vector: dict[str, Any]) -> None:
    part = model_parse(vector["text"])
    expect = vector["expect"]
    if expect is None:
        assert part is None
    else:
        assert part is not None
        assert (part.sid, part.mid, part.seq, part.total, part.exp) == (
            expect["sid"],
            expect["mid"],
            expect["seq"],
            expect["total"],
            expect["exp"],
        )
        assert part.chunk == base64.b64decode(expect["chunk_b64"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("QUJD", b"ABC"),
        ("QR==", b"A"),
        ("QUI=", b"AB"),
        ("QUJ=", b"AB"),
        ("", b""),
    ],
)
def test_model_base64_accepts(text: str, expected: bytes) -> None:
    assert go_std_base64_decode(text) == expected


@pytest.mark.parametrize(
    "text", ["QUJD=", "QUJD====", "QQ=", "QQ=A", "Q===", "=QQQ", "QQ==QQ==", "QUI", "===="]
)
def test_model_base64_rejects(text: str) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the model's private reject type
        go_std_base64_decode(text)


def test_go_trim_set_is_python_isspace_minus_separators() -> None:
    python_space = {chr(c) for c in range(0x110000) if chr(c).isspace()}
    assert python_space - set(GO_TRIM_SET) == {"\x1c", "\x1d", "\x1e", "\x1f"}
    assert set(GO_TRIM_SET) <= python_space


# --- generators of grammar-near text ---------------------------------------

_INT64_MAX = 2**63 - 1
_NEAR_SPACE = [*GO_TRIM_SET, "\x1c", "\x1d", "\x1e", "\x1f", "\u180e", "\u200b", "\ufeff", "\x00"]
_BOUNDARY_INTS = [0, 1, 2, 63, 64, 65, _INT64_MAX, _INT64_MAX + 1, -(2**63), -(2**63) - 1, 10**19, 10**20]

ints = st.one_of(
    st.integers(-70, 70),
    st.sampled_from(_BOUNDARY_INTS),
    st.integers(-(2**65), 2**65),
)


@st.composite
def int_text(draw: st.DrawFn, bad: bool = False) -> str:
    """Decimal text around Go's ParseInt rules: signs, leading zeros and
    range edges; with ``bad``, often a near-miss."""
    if not bad or draw(st.booleans()):
        value = draw(ints)
        sign = "-" if value < 0 else draw(st.sampled_from(["", "", "+"]))
        zeros = "0" * draw(st.sampled_from([0, 0, 0, 1, 3, 25]))
        return f"{sign}{zeros}{abs(value)}"
    return draw(
        st.sampled_from(
            [
                "",
                "+",
                "-",
                "1.5",
                "1_0",
                " 1",
                "1 ",
                "\u0661",
                "0x10",
                "--1",
                "+-1",
                "1e3",
                "\uff11",
                "01/",
                "1\n",
            ]
        )
    )


@st.composite
def id_text(draw: st.DrawFn, bad: bool = False) -> str:
    if not bad:
        return draw(st.text(alphabet="0123456789abcdef", min_size=1, max_size=32))
    return draw(st.text(alphabet="0123456789abcdefABCDEFg \n", min_size=0, max_size=34))


@st.composite
def seq_text(draw: st.DrawFn, bad: bool = False) -> str:
    if not bad:
        total = draw(st.integers(1, 64))
        seq = draw(st.integers(1, total))
        zeros = "0" * draw(st.sampled_from([0, 0, 0, 2]))
        return f"{zeros}{seq}/{draw(st.sampled_from(['', '+', '0']))}{total}"
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return f"{draw(int_text(bad=True))}/{draw(int_text(bad=True))}"
    if kind == 1:
        return f"{draw(st.integers(-1, 66))}/{draw(st.integers(-1, 66))}"
    return draw(st.sampled_from(["1", "1/1/1", "/1", "1/", "/", "1//1", "1 /1", "2/1", "0/0", "1/65"]))


_KNOWN = ("v", "sid", "mid", "seq", "exp")


@st.composite
def known_item(draw: st.DrawFn, key: str, bad: bool = False) -> str:
    if key == "v":
        value = draw(
            st.sampled_from(["2", "0", "-1", "", "1.0", "v"] if bad else ["1", "1", "01", "+1", "+0001"])
        )
    elif key in ("sid", "mid"):
        value = draw(id_text(bad))
    elif key == "seq":
        value = draw(seq_text(bad))
    else:
        value = draw(int_text(bad))
    return f"{key}={value}"


@st.composite
def unknown_item(draw: st.DrawFn) -> str:
    key = draw(
        st.sampled_from(["foo", " sid", "sid ", "V", "SID", "", "vx", "exp2", "s", "m", "e", "x=y", "\u00e9"])
    )
    value = draw(st.text(alphabet="a1=/ -[\n", max_size=6))
    return f"{key}={value}"


@st.composite
def header_text(draw: st.DrawFn, damage: set[str]) -> str:
    """Items of a header: the five known keys (exp sometimes absent), plus
    duplicates and unknown keys, maybe shuffled; ``damage`` names what to
    break."""
    if draw(st.booleans()):
        # The encoder's exact shape (the parser's fast path), values included
        # up to and past what that path handles.
        items = [
            "v=1",
            f"sid={draw(id_text())}",
            f"mid={draw(id_text())}",
            f"seq={draw(seq_text())}",
            f"exp={draw(st.one_of(st.integers(-(10**19), 10**19), st.sampled_from(_BOUNDARY_INTS)))}",
        ]
    else:
        items = [draw(known_item(key)) for key in _KNOWN if key != "exp" or draw(st.booleans())]
        extras = draw(
            st.lists(st.one_of(unknown_item(), st.sampled_from(_KNOWN).flatmap(known_item)), max_size=3)
        )
        for item in extras:
            items.insert(draw(st.integers(0, len(items))), item)
        if draw(st.booleans()):
            items = list(draw(st.permutations(items)))
    if "known" in damage:
        items.insert(
            draw(st.integers(0, len(items))),
            draw(st.sampled_from(_KNOWN).flatmap(lambda key: known_item(key, bad=True))),
        )
    if "missing" in damage and items:
        del items[draw(st.integers(0, len(items) - 1))]
    if "item" in damage:
        items.insert(
            draw(st.integers(0, len(items))), draw(st.sampled_from(["", "novalue", " ", "sid", "v1"]))
        )
    header = ",".join(items)
    if "comma" in damage:
        header = draw(st.sampled_from([header + ",", "," + header, header.replace(",", ",,", 1)]))
    return header


@st.composite
def body_text(draw: st.DrawFn, bad: bool = False) -> str:
    """Base64 of random bytes, maybe with body whitespace; with ``bad``,
    padding, alphabet or whitespace damage."""
    raw = draw(st.binary(min_size=0 if bad else 1, max_size=20))
    chars = list(base64.b64encode(raw).decode())
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 4))):
            ws = draw(st.sampled_from(["\t", "\n", "\f", "\r", " ", "\r\n"]))
            chars.insert(draw(st.integers(0, len(chars))), ws)
    if not bad:
        return "".join(chars)
    mutation = draw(st.integers(0, 6))
    if mutation == 0 and chars:
        chars = chars[: draw(st.integers(0, len(chars) - 1))]
    elif mutation == 1:
        chars += ["="] * draw(st.integers(1, 5))
    elif mutation == 2:
        ws = draw(st.sampled_from(["\v", "\xa0", "\u2028", "\x1c", "\u3000"]))
        chars.insert(draw(st.integers(0, len(chars))), ws)
    elif mutation == 3 and chars:
        index = draw(st.integers(0, len(chars) - 1))
        chars[index] = draw(st.sampled_from(["=", "-", "_", "!", "]", "\u00e9", "A", "/", "+", "\x00"]))
    elif mutation == 4:
        chars = list(draw(st.text(alphabet="AQR/+=\t\n\f\r \x0b", max_size=12)))
    else:
        chars += list(draw(st.sampled_from(["--mcp[]--QQ", "]--QUJD", "\n--mcp[v=1]--QQ==", "QQ=="])))
    return "".join(chars)


_DAMAGE = ["known", "missing", "item", "comma", "body", "tag", "close", "space"]


@st.composite
def grammar_near(draw: st.DrawFn) -> str:
    """An envelope with zero to three kinds of damage (about a third are
    undamaged and valid)."""
    damage = set(draw(st.lists(st.sampled_from(_DAMAGE), max_size=3)))
    spaces = [*_NEAR_SPACE] if "space" in damage else list(GO_TRIM_SET)
    head = draw(st.text(alphabet=spaces, max_size=3))
    tail = draw(st.text(alphabet=spaces, max_size=3))
    tag = "--mcp["
    if "tag" in damage:
        tag = draw(
            st.sampled_from(["--MCP[", "-mcp[", "--mcp", "x--mcp[", "--mcp[[", "--mcp[ ", "\u2013-mcp["])
        )
    close = "]--"
    if "close" in damage:
        close = draw(st.sampled_from(["]-", "] --", "]]--", "]---", "", "]--\n", "]\u2014"]))
    return head + tag + draw(header_text(damage)) + close + draw(body_text("body" in damage)) + tail


# --- the comparisons --------------------------------------------------------


@SETTINGS
@given(grammar_near())
def test_parse_matches_go_model_on_grammar_near_text(text: str) -> None:
    _agree(text)


@SETTINGS
@given(st.text(alphabet="-mcp[]=,/vsidexq0123456789abfAF+QUJDR\t\n\r\x0b \xa0\x1c", max_size=60))
def test_parse_matches_go_model_on_grammar_alphabet_soup(text: str) -> None:
    _agree(text)
    _agree("--mcp[" + text)
    _agree("--mcp[v=1,sid=aa,mid=bb,seq=1/1," + text)


@SETTINGS
@given(st.text(max_size=80))
def test_parse_matches_go_model_on_arbitrary_text(text: str) -> None:
    _agree(text)
    _agree("--mcp[v=1,sid=aa,mid=bb,seq=1/1]--" + text)
    _agree("--mcp[" + text + "]--QUJD")


@SETTINGS
@given(
    payload=st.binary(min_size=1, max_size=300),
    sid=st.text(alphabet="0123456789abcdef", min_size=1, max_size=32),
    exp=st.integers(-(2**63), 2**63 - 1),
    chunk_size=st.integers(5, 400),
)
def test_encoder_output_is_accepted_by_go_model(payload: bytes, sid: str, exp: int, chunk_size: int) -> None:
    for text in wire.encode(payload, sid=sid, exp=exp, chunk_size=chunk_size):
        model = model_parse(text)
        assert model is not None
        assert _as_tuple(model) == _as_tuple(wire.parse(text))


# --- assembler against the model --------------------------------------------


@st.composite
def assembler_ops(draw: st.DrawFn) -> tuple[dict[str, int | float], list[tuple[str, ModelPart, float]]]:
    config: dict[str, int | float] = {
        "max_pending_per_peer": draw(st.integers(1, 3)),
        "max_message_bytes": draw(st.integers(1, 12)),
        "max_total_bytes": draw(st.integers(1, 24)),
        # Quarter seconds: exact in binary floating point, like Go's integer ns.
        "timeout": draw(st.integers(1, 40)) / 4,
    }
    ops = []
    for _ in range(draw(st.integers(1, 60))):
        total = draw(st.integers(1, 4))
        part = ModelPart(
            sid=draw(st.sampled_from(["a", "b"])),
            mid=draw(st.sampled_from(["1", "2", "3", "4"])),
            seq=draw(st.integers(1, total)),
            total=total,
            exp=draw(st.sampled_from([0, 0, -5, 100, 101, 103, 110])),
            chunk=draw(st.binary(min_size=1, max_size=5)),
        )
        peer = draw(st.sampled_from(["p", "q", "r"]))
        now = draw(st.integers(380, 460)) / 4  # 95.0 .. 115.0, around the exps above
        ops.append((peer, part, now))
    return config, ops


_ERROR_KIND: dict[type[wire.WireError], str] = {
    wire.ExpiredError: "expired",
    wire.TooLargeError: "too_large",
    wire.BufferFullError: "overflow",
    wire.PartCountError: "part_count",
}


@settings(max_examples=300, deadline=None)
@given(assembler_ops())
def test_assembler_matches_go_model(
    case: tuple[dict[str, int | float], list[tuple[str, ModelPart, float]]],
) -> None:
    config, ops = case
    model = ModelAssembler(**config)  # type: ignore[arg-type]
    real = wire.Assembler(wire.AssemblerConfig(**config))  # type: ignore[arg-type]
    for peer, mpart, now in ops:
        part = wire.Part(mpart.sid, mpart.mid, mpart.seq, mpart.total, mpart.exp, mpart.chunk)
        try:
            expected: object = model.add(peer, mpart, now)
        except ModelError as err:
            expected = err.kind
        try:
            got: object = real.add(peer, part, now)
        except wire.WireError as err:
            got = _ERROR_KIND[type(err)]
        assert got == expected, (peer, mpart, now)
        assert real.buffered_bytes == model.total_bytes
        assert real.pending_messages == len(model.pending)
        for name in ("p", "q", "r"):
            assert real.pending(name) == model.per_peer.get(name, 0)
