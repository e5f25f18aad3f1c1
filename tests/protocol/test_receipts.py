"""Signed receipts (WIRE.md §Signed receipts): a receipt verifies exactly
when it is the bytes its key signed; any other input is a ReceiptError,
never another exception."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from brmcp.protocol.receipts import (
    MAX_RECEIPT_PAYLOAD,
    RECEIPT_KEY_META,
    SIGNED_RECEIPT_KEY,
    ReceiptError,
    ReceiptSigner,
    args_sha256,
    receipt_key_from_meta,
    signed_receipt_from_meta,
    verify_receipt,
)
from brmcp.testing import uid

SIGNER = ReceiptSigner(Ed25519PrivateKey.generate(), bot=uid(1))
OTHER = ReceiptSigner(Ed25519PrivateKey.generate())

names = st.text(min_size=1, max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def sign(signer: ReceiptSigner = SIGNER, **fields: Any) -> dict[str, str]:
    values: dict[str, Any] = {
        "call_id": "c" * 32,
        "caller": uid(2),
        "tool": "fortune",
        "args_digest": args_sha256({}),
        "call_key": "k" * 32,
        "atoms": 10_000,
        "time": 1_800_000_000,
    }
    values.update(fields)
    return signer.sign(**values)


@settings(max_examples=60, deadline=None)
@given(
    tool=names,
    call_key=st.none() | st.text(max_size=64),
    atoms=st.integers(0, 2**62),
    moment=st.integers(0, 2**40),
    arguments=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
)
def test_sign_then_verify_gives_back_every_field(
    tool: str, call_key: str | None, atoms: int, moment: int, arguments: dict[str, Any]
) -> None:
    digest = args_sha256(arguments)
    signed = sign(tool=tool, call_key=call_key, atoms=atoms, time=moment, args_digest=digest)
    claims = verify_receipt(signed, SIGNER.public_hex)
    assert (claims.tool, claims.call_key, claims.atoms, claims.time) == (tool, call_key or "", atoms, moment)
    assert (claims.caller, claims.bot, claims.pub, claims.args_sha256) == (
        uid(2),
        uid(1),
        SIGNER.public_hex,
        digest,
    )
    assert claims.receipt_id == verify_receipt(dict(signed)).receipt_id
    assert claims.to_dict()["receiptId"] == claims.receipt_id


def _flip(text: str, index: int, alphabet: str) -> str:
    position = index % len(text)
    replacement = alphabet[(alphabet.index(text[position]) + 1) % len(alphabet)]
    return text[:position] + replacement + text[position + 1 :]


@settings(max_examples=120, deadline=None)
@given(index=st.integers(0, 10_000), field=st.sampled_from(["payload", "sig", "pub"]))
def test_any_one_changed_character_fails(index: int, field: str) -> None:
    signed = sign()
    alphabet = (
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
        if field == "payload"
        else "0123456789abcdef"
    )
    forged = dict(signed, **{field: _flip(signed[field], index, alphabet)})
    with pytest.raises(ReceiptError):
        verify_receipt(forged)


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_any_one_changed_payload_byte_fails(index: int, bit: int) -> None:
    signed = sign()
    raw = bytearray(base64.b64decode(signed["payload"]))
    raw[index % len(raw)] ^= 1 << bit
    forged = dict(signed, payload=base64.b64encode(bytes(raw)).decode())
    with pytest.raises(ReceiptError):
        verify_receipt(forged)


def test_a_receipt_under_another_key_than_expected_fails() -> None:
    signed = sign(OTHER)
    verify_receipt(signed)  # valid under its own key
    with pytest.raises(ReceiptError, match="unexpected key"):
        verify_receipt(signed, SIGNER.public_hex)
    # A valid signature of another key with the expected pub swapped in.
    with pytest.raises(ReceiptError, match="signature invalid"):
        verify_receipt(dict(signed, pub=SIGNER.public_hex), SIGNER.public_hex)


def test_an_oversize_payload_is_refused_unread() -> None:
    big = base64.b64encode(b"{" + b" " * MAX_RECEIPT_PAYLOAD + b"}").decode()
    huge = base64.b64encode(b" " * (4 * MAX_RECEIPT_PAYLOAD)).decode()
    for payload in (big, huge):
        with pytest.raises(ReceiptError, match="at most"):
            verify_receipt(dict(sign(), payload=payload))


def test_a_signed_payload_with_a_missing_field_fails() -> None:
    private = Ed25519PrivateKey.generate()
    payload = json.dumps({"v": 1, "id": "x", "tool": "t"}).encode()
    signed = {
        "payload": base64.b64encode(payload).decode(),
        "sig": private.sign(payload).hex(),
        "pub": ReceiptSigner(private).public_hex,
    }
    with pytest.raises(ReceiptError, match="caller"):
        verify_receipt(signed)


@settings(max_examples=200, deadline=None)
@given(garbage=json_values | st.dictionaries(st.sampled_from(["payload", "sig", "pub"]), json_values))
def test_garbage_raises_only_receipt_error(garbage: Any) -> None:
    with pytest.raises(ReceiptError):
        verify_receipt(garbage)


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=600))
def test_any_signed_bytes_verify_or_raise_receipt_error(payload: bytes) -> None:
    # A hostile bot signs whatever it likes: the signature holds, the fields may not.
    private = Ed25519PrivateKey.generate()
    signed = {
        "payload": base64.b64encode(payload).decode(),
        "sig": private.sign(payload).hex(),
        "pub": ReceiptSigner(private).public_hex,
    }
    try:
        verify_receipt(signed)
    except ReceiptError:
        pass


def test_meta_readers_take_only_their_shapes() -> None:
    signed = sign()
    assert signed_receipt_from_meta({SIGNED_RECEIPT_KEY: signed}) == signed
    assert signed_receipt_from_meta({SIGNED_RECEIPT_KEY: dict(signed, sig=1)}) is None
    assert signed_receipt_from_meta("x") is None
    assert receipt_key_from_meta({RECEIPT_KEY_META: SIGNER.public_hex}) == SIGNER.public_hex
    assert receipt_key_from_meta({RECEIPT_KEY_META: SIGNER.public_hex.upper()}) is None


def test_args_digest_is_the_sorted_compact_json() -> None:
    import hashlib

    expected = hashlib.sha256('{"a":[1,"é"],"b":null}'.encode()).hexdigest()
    assert args_sha256({"b": None, "a": [1, "é"]}) == expected
    assert args_sha256(None) == args_sha256({})


def test_the_key_file_is_kept_and_reloaded(tmp_path: Path) -> None:
    first = ReceiptSigner.load_or_create(tmp_path / "receiptkey.json")
    again = ReceiptSigner.load_or_create(tmp_path / "receiptkey.json")
    assert first.public_hex == again.public_hex
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ReceiptError, match=r"bad\.json"):
        ReceiptSigner.load_or_create(tmp_path / "bad.json")
