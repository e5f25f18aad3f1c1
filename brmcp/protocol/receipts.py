"""Signed receipts (WIRE.md §Signed receipts): a bot's ed25519 statement
that it served one call to one caller for so many atoms.

The charge receipt of WIRE.md §Receipts (``brmcp/chargedAtoms``,
``brmcp/balanceAtoms``) tells a caller its balance; a *signed* receipt is
evidence a third party can check. A result carries it under
:data:`SIGNED_RECEIPT_KEY` as ``{"payload", "sig", "pub"}``, the shape of
the directory's snapshots: ``payload`` is the base64 (standard alphabet,
padded) of the exact bytes signed, ``sig`` and ``pub`` are hex ed25519.
The payload bytes are the canon: a verifier checks the signature over them
first and only then decodes them, so no canonical JSON is needed to verify.
They decode to::

    {"v": 1, "id": call id, "caller": uid, "tool": name,
     "argsSha256": hex, "callKey": string, "atoms": int, "time": unix seconds}

with ``"bot": uid`` after ``"v"`` when the bot knows its own uid. ``atoms``
is what the call was charged (0 for a free call); ``argsSha256`` is
:func:`args_sha256` of the arguments as the bot parsed them, so a caller
that kept its arguments can show the receipt is for that request;
``callKey`` is ``""`` for an unkeyed call. The :attr:`ReceiptClaims.receipt_id`
of a receipt is the SHA-256 of its payload bytes: two receipts with one id
are the same receipt.

A bot announces its receipt key as 64 hex characters under
:data:`RECEIPT_KEY_META` in the ``_meta`` of its ``tools/list`` answers
(and of a marked ``initialize``, WIRE.md §Eras "First contact"); a
directory records it in the bot's listing. A receipt proves only what its
key's holder signed: the key is trusted because the listing or the
caller's own session with the bot's uid gave it.

Pure data, no I/O; the key file is :mod:`brmcp._ops.edkey`'s.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .._ops import edkey

__all__ = [
    "MAX_RECEIPT_PAYLOAD",
    "RECEIPT_KEY_FILENAME",
    "RECEIPT_KEY_META",
    "RECEIPT_VERSION",
    "SIGNED_RECEIPT_KEY",
    "ReceiptClaims",
    "ReceiptError",
    "ReceiptSigner",
    "args_sha256",
    "is_receipt_key",
    "receipt_key_from_meta",
    "signed_receipt_from_meta",
    "verify_receipt",
]

RECEIPT_VERSION = 1
#: The result ``_meta`` key that carries a signed receipt.
SIGNED_RECEIPT_KEY = "brmcp/signedReceipt"
#: The ``tools/list`` (and marked ``initialize``) ``_meta`` key naming the
#: bot's receipt key, 64 hex characters.
RECEIPT_KEY_META = "brmcp/receiptKey"
#: The key file's name in a bot's data directory (brmcp-serve).
RECEIPT_KEY_FILENAME = "receiptkey.json"
#: A payload longer than this (bytes, decoded) is refused unread: the fields
#: above fit in well under 1 KiB.
MAX_RECEIPT_PAYLOAD = 4096
#: Longest tool name and callKey a receipt may carry (characters).
_MAX_NAME = 256
_MAX_CALL_KEY = 256
_HEX = frozenset("0123456789abcdef")


class ReceiptError(ValueError):
    """A receipt that does not verify or decode; the message names the
    failed check."""


def args_sha256(arguments: Mapping[str, Any] | None) -> str:
    """The SHA-256 (64 lowercase hex) of ``arguments`` written as JSON with
    keys sorted, no whitespace (``","`` and ``":"``), non-ASCII as UTF-8
    (``json.dumps(..., sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)``). None hashes as ``{}``. Raises TypeError or
    ValueError for values JSON cannot write."""
    text = json.dumps(
        dict(arguments or {}), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_receipt_key(value: Any) -> bool:
    """True for a string of 64 lowercase hex characters (an ed25519 public key)."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def receipt_key_from_meta(meta: Any) -> str | None:
    """The receipt key a ``_meta`` mapping announces under
    :data:`RECEIPT_KEY_META`, or None when absent or not 64 lowercase hex.
    Never raises."""
    if not isinstance(meta, Mapping):
        return None
    value = meta.get(RECEIPT_KEY_META)
    return value if is_receipt_key(value) else None


def signed_receipt_from_meta(meta: Any) -> dict[str, str] | None:
    """The ``{"payload", "sig", "pub"}`` object under
    :data:`SIGNED_RECEIPT_KEY` in a result's ``_meta``, or None when absent
    or not three strings (unverified: use :func:`verify_receipt`). Never
    raises."""
    if not isinstance(meta, Mapping):
        return None
    value = meta.get(SIGNED_RECEIPT_KEY)
    if not isinstance(value, Mapping):
        return None
    out = {name: value.get(name) for name in ("payload", "sig", "pub")}
    if not all(isinstance(item, str) for item in out.values()):
        return None
    return {name: str(item) for name, item in out.items()}


@dataclass(frozen=True, slots=True)
class ReceiptClaims:
    """What a verified receipt says (fields as in the module docstring).
    ``pub`` is the signing key (hex), ``receipt_id`` the SHA-256 (hex) of the
    payload bytes, ``bot`` the bot's uid or ``""`` when the bot did not
    name itself."""

    call_id: str
    caller: str
    tool: str
    args_sha256: str
    call_key: str
    atoms: int
    time: int
    bot: str
    pub: str
    receipt_id: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{receiptId, pub, bot, id, caller, tool, argsSha256,
        callKey, atoms, time}``."""
        return {
            "receiptId": self.receipt_id,
            "pub": self.pub,
            "bot": self.bot,
            "id": self.call_id,
            "caller": self.caller,
            "tool": self.tool,
            "argsSha256": self.args_sha256,
            "callKey": self.call_key,
            "atoms": self.atoms,
            "time": self.time,
        }


class ReceiptSigner:
    """A bot's receipt key: signs :class:`ReceiptClaims` payloads."""

    def __init__(self, private: Ed25519PrivateKey, *, bot: str = "") -> None:
        self._private = private
        #: The public key, 64 lowercase hex characters.
        self.public_hex = edkey.public_hex(private)
        #: The bot's own uid, written into each payload when not empty.
        self.bot = bot

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str], *, bot: str = "") -> ReceiptSigner:
        """The key in ``path`` (Go's key-file format, :mod:`brmcp._ops.edkey`),
        created there when missing. Raises :class:`ReceiptError` naming the
        file when it cannot be used."""
        try:
            return cls(edkey.load_or_create_key(path, "receipt key"), bot=bot)
        except edkey.KeyFileError as exc:
            raise ReceiptError(str(exc)) from None

    def sign(
        self,
        *,
        call_id: str,
        caller: str,
        tool: str,
        args_digest: str,
        call_key: str | None,
        atoms: int,
        time: int,
    ) -> dict[str, str]:
        """The signed receipt ``{"payload": base64, "sig": hex, "pub": hex}``
        for one call. ``args_digest`` is :func:`args_sha256` of its arguments,
        ``atoms`` what it was charged (>= 0), ``time`` unix seconds.
        Raises ValueError for a negative ``atoms``."""
        if atoms < 0:
            raise ValueError(f"receipt atoms must be >= 0, got {atoms}")
        fields: dict[str, Any] = {"v": RECEIPT_VERSION}
        if self.bot:
            fields["bot"] = self.bot
        fields.update(
            {
                "id": call_id,
                "caller": caller,
                "tool": tool,
                "argsSha256": args_digest,
                "callKey": call_key or "",
                "atoms": int(atoms),
                "time": int(time),
            }
        )
        payload = json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return {
            "payload": base64.b64encode(payload).decode("ascii"),
            "sig": self._private.sign(payload).hex(),
            "pub": self.public_hex,
        }


def _string(decoded: Mapping[str, Any], name: str, limit: int, *, optional: bool = False) -> str:
    value = decoded.get(name)
    if value is None and optional:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise ReceiptError(
            f"receipt payload corrupt: {name!r} must be a string of at most {limit} characters"
        )
    return value


def _whole(decoded: Mapping[str, Any], name: str) -> int:
    value = decoded.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise ReceiptError(f"receipt payload corrupt: {name!r} must be an integer >= 0")
    return value


def verify_receipt(signed: Any, expected_pub: str | None = None) -> ReceiptClaims:
    """Check ``signed`` (a parsed ``{"payload", "sig", "pub"}`` object) and
    decode it. With ``expected_pub`` (hex, the trust root: a listing's or a
    session's receipt key) ``pub`` must equal it; without, the receipt is
    checked against its own ``pub`` and the caller must judge that key.

    Order: shape; key; the signature over the base64-decoded payload bytes
    (at most :data:`MAX_RECEIPT_PAYLOAD`); only then is the payload parsed,
    ``v`` must be 1 and every field of the module docstring present with
    its type (uids and ``argsSha256`` 64 lowercase hex). Raises
    :class:`ReceiptError` naming the failed check.
    """
    if not isinstance(signed, Mapping):
        raise ReceiptError("receipt malformed: expected a JSON object {payload, sig, pub}")
    pub_hex, sig_hex, payload_b64 = signed.get("pub"), signed.get("sig"), signed.get("payload")
    if not is_receipt_key(pub_hex):
        raise ReceiptError("receipt public key malformed: expected 64 lowercase hex characters")
    assert isinstance(pub_hex, str)
    if expected_pub is not None and pub_hex != expected_pub:
        raise ReceiptError("receipt signed by an unexpected key")
    if not isinstance(sig_hex, str) or len(sig_hex) != 128:
        raise ReceiptError("receipt signature malformed: expected 128 hex characters")
    try:
        sig = bytes.fromhex(sig_hex)
    except ValueError:
        raise ReceiptError("receipt signature malformed: expected 128 hex characters") from None
    if not isinstance(payload_b64, str) or len(payload_b64) > (MAX_RECEIPT_PAYLOAD + 2) // 3 * 4:
        raise ReceiptError(
            f"receipt payload malformed: expected base64 of at most {MAX_RECEIPT_PAYLOAD} bytes"
        )
    try:
        payload = base64.b64decode(payload_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ReceiptError("receipt payload malformed: not base64") from None
    if base64.b64encode(payload).decode("ascii") != payload_b64:
        # Only the encoder's own spelling: unused bits set in the last
        # character would give a second text for one signed payload.
        raise ReceiptError("receipt payload malformed: not canonical base64")
    if len(payload) > MAX_RECEIPT_PAYLOAD:
        raise ReceiptError(
            f"receipt payload malformed: expected base64 of at most {MAX_RECEIPT_PAYLOAD} bytes"
        )
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub_hex)).verify(sig, payload)
    except InvalidSignature:
        raise ReceiptError("receipt signature invalid") from None
    except ValueError:
        raise ReceiptError("receipt public key malformed") from None
    try:
        decoded = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ReceiptError(f"receipt payload corrupt: {exc}") from None
    if not isinstance(decoded, dict):
        raise ReceiptError("receipt payload corrupt: not a JSON object")
    version = decoded.get("v")
    if version != RECEIPT_VERSION or isinstance(version, bool):
        raise ReceiptError(f"receipt version {version!r} unsupported")
    caller = _string(decoded, "caller", 64)
    bot = _string(decoded, "bot", 64, optional=True)
    digest = _string(decoded, "argsSha256", 64)
    for name, value in (("caller", caller), ("argsSha256", digest)):
        if not is_receipt_key(value):
            raise ReceiptError(f"receipt payload corrupt: {name!r} must be 64 lowercase hex characters")
    if bot and not is_receipt_key(bot):
        raise ReceiptError("receipt payload corrupt: 'bot' must be 64 lowercase hex characters")
    return ReceiptClaims(
        call_id=_string(decoded, "id", 128),
        caller=caller,
        tool=_string(decoded, "tool", _MAX_NAME),
        args_sha256=digest,
        call_key=_string(decoded, "callKey", _MAX_CALL_KEY),
        atoms=_whole(decoded, "atoms"),
        time=_whole(decoded, "time"),
        bot=bot,
        pub=pub_hex,
        receipt_id=hashlib.sha256(payload).hexdigest(),
    )
