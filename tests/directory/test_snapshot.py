"""Signed snapshots and the snapshot key file (brmcp/directory/model/_snapshot.py,
docs/directory.md §Snapshots): Go's payload bytes and key format, the
signature checked before decoding, tampering and wrong keys refused."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from brmcp.directory.model import (
    Signer,
    SnapshotError,
    SnapshotListing,
    build_payload,
    verify_snapshot,
)

A = "a" * 64
B = "b" * 64
CATALOG = '[{"name":"fortune","description":"\\u003cb\\u003e","_meta":{"brmcp/priceAtoms":5}}]'


def listing(uid: str, **kw: object) -> SnapshotListing:
    return SnapshotListing(uid=uid, description="d", catalog=CATALOG, **kw)  # type: ignore[arg-type]


def test_payload_bytes_match_go() -> None:
    payload = build_payload([listing(B, tags=("x",)), listing(A, expires_at=9)], 77)
    assert payload == (
        b'{"v":1,"generatedAt":77,"listings":['
        b'{"uid":"' + A.encode() + b'","description":"d","catalog":' + CATALOG.encode() + b","
        b'"catalogCheckedAt":0,"lastVerifiedExecution":0,"expiresAt":9},'
        b'{"uid":"' + B.encode() + b'","description":"d","tags":["x"],"catalog":' + CATALOG.encode() + b","
        b'"catalogCheckedAt":0,"lastVerifiedExecution":0,"expiresAt":0}]}'
    )
    assert build_payload([], 5) == b'{"v":1,"generatedAt":5,"listings":null}'


def test_key_file_round_trip_in_go_format(tmp_path: Path) -> None:
    path = tmp_path / "snapshotkey.json"
    signer = Signer.load_or_create(path)
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    fields = json.loads(text)
    assert list(fields) == ["pub", "priv"]
    assert text.startswith('{\n  "pub": "')
    assert len(bytes.fromhex(fields["priv"])) == 64
    assert fields["priv"].endswith(fields["pub"])
    again = Signer.load_or_create(path)
    assert again.public_hex == signer.public_hex


def test_key_file_written_by_go_loads(tmp_path: Path) -> None:
    # Go's ed25519.PrivateKey is seed || public key, both hex in the file.
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes_raw()
    pub = private.public_key().public_bytes_raw()
    path = tmp_path / "snapshotkey.json"
    path.write_text(json.dumps({"pub": pub.hex(), "priv": (seed + pub).hex()}, indent=2))
    signer = Signer.load_or_create(path)
    assert signer.public_hex == pub.hex()
    signed = signer.build_snapshot([listing(A)], 1)
    private.public_key().verify(bytes.fromhex(signed["sig"]), base64.b64decode(signed["payload"]))


@pytest.mark.parametrize(
    "text",
    ['{"pub": "zz", "priv": "00"}', '{"pub": "' + "00" * 32 + '", "priv": "' + "00" * 64 + '"}', "[]"],
)
def test_bad_key_files(tmp_path: Path, text: str) -> None:
    path = tmp_path / "snapshotkey.json"
    path.write_text(text)
    with pytest.raises(SnapshotError, match=str(path)):
        Signer.load_or_create(path)


def test_verify_decodes(tmp_path: Path) -> None:
    signer = Signer.load_or_create(tmp_path / "k.json")
    signed = signer.build_snapshot([listing(B), listing(A)], 42)
    snap = verify_snapshot(signed, signer.public_hex)
    assert snap.generated_at == 42
    assert [item["uid"] for item in snap.listings] == [A, B]
    assert snap.listings[0]["catalog"][0]["description"] == "<b>"


def test_wrong_key_bad_sig_bad_base64(tmp_path: Path) -> None:
    signer = Signer.load_or_create(tmp_path / "k.json")
    other = Signer.load_or_create(tmp_path / "o.json")
    signed = signer.build_snapshot([listing(A)], 1)
    with pytest.raises(SnapshotError, match="unexpected key"):
        verify_snapshot(signed, other.public_hex)
    with pytest.raises(SnapshotError, match="no trusted key"):
        verify_snapshot(signed, "")
    forged = {**signed, "pub": other.public_hex}
    with pytest.raises(SnapshotError, match="signature invalid"):
        verify_snapshot(forged, other.public_hex)
    with pytest.raises(SnapshotError, match="not base64"):
        verify_snapshot({**signed, "payload": "@@@"}, signer.public_hex)
    with pytest.raises(SnapshotError, match="signature malformed"):
        verify_snapshot({**signed, "sig": "xyz"}, signer.public_hex)
    unsigned_garbage = signer.sign(b"not json")
    with pytest.raises(SnapshotError, match="payload corrupt"):
        verify_snapshot(unsigned_garbage, signer.public_hex)
    with pytest.raises(SnapshotError, match="version 2 unsupported"):
        verify_snapshot(signer.sign(b'{"v":2}'), signer.public_hex)


_SIGNER = Signer(Ed25519PrivateKey.generate())
_SIGNED = _SIGNER.build_snapshot([listing(A, tags=("t",)), listing(B)], 1_800_000_000)
_PAYLOAD = base64.b64decode(_SIGNED["payload"])


@given(position=st.integers(min_value=0, max_value=len(_PAYLOAD) - 1), flip=st.integers(1, 255))
def test_any_tampered_byte_is_refused(position: int, flip: int) -> None:
    tampered = bytearray(_PAYLOAD)
    tampered[position] ^= flip
    forged = {**_SIGNED, "payload": base64.b64encode(bytes(tampered)).decode()}
    with pytest.raises(SnapshotError, match="signature invalid"):
        verify_snapshot(forged, _SIGNER.public_hex)


@given(sig_byte=st.integers(min_value=0, max_value=63), flip=st.integers(1, 255))
def test_any_tampered_signature_is_refused(sig_byte: int, flip: int) -> None:
    sig = bytearray(bytes.fromhex(_SIGNED["sig"]))
    sig[sig_byte] ^= flip
    with pytest.raises(SnapshotError, match="signature invalid"):
        verify_snapshot({**_SIGNED, "sig": sig.hex()}, _SIGNER.public_hex)
