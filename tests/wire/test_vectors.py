"""The shared envelope vectors (tests/vectors/wire-v1.json), parse and encode."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from brmcp import wire
from tests.kit.paths import REPO
from tests.kit.paths import VECTORS as VECTOR_DIR

VECTORS_PATH = VECTOR_DIR / "wire-v1.json"
SHARED_PATH = REPO.parent / "shared" / "vectors" / "wire-v1.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text())


@pytest.mark.parametrize("vector", VECTORS["parse"], ids=lambda v: v["name"])
def test_parse_vector(vector: dict[str, Any]) -> None:
    part = wire.parse(vector["text"])
    expect = vector["expect"]
    assert wire.is_envelope(vector["text"]) is (expect is not None)
    if expect is None:
        assert part is None
        return
    assert part is not None
    assert (part.sid, part.mid, part.seq, part.total, part.exp) == (
        expect["sid"],
        expect["mid"],
        expect["seq"],
        expect["total"],
        expect["exp"],
    )
    assert part.chunk == base64.b64decode(expect["chunk_b64"])


@pytest.mark.parametrize("vector", VECTORS["encode"], ids=lambda v: v["name"])
def test_encode_vector(vector: dict[str, Any]) -> None:
    payload = base64.b64decode(vector["payload_b64"])
    parts = wire.encode(
        payload, sid=vector["sid"], mid=vector["mid"], exp=vector["exp"], chunk_size=vector["chunk_size"]
    )
    assert parts == vector["parts"]
    assembler = wire.Assembler()
    out = None
    for text in reversed(parts):
        part = wire.parse(text)
        assert part is not None
        out = assembler.add("peer", part, now=float(vector["exp"] or 0))
    assert out == payload


def test_vectors_cover_both_kinds() -> None:
    assert len(VECTORS["parse"]) >= 39
    assert len(VECTORS["encode"]) >= 3


@pytest.mark.skipif(
    not SHARED_PATH.exists(), reason="../shared/vectors is not present (users clone only the project)"
)
def test_vendored_copy_matches_shared() -> None:
    assert json.loads(SHARED_PATH.read_text()) == VECTORS
