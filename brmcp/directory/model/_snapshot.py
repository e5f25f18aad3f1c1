"""Signed snapshots of the index (docs/directory.md §Snapshots;
karamble/brmcp, ``directory/snapshot.go``).

A snapshot is ``{"payload", "sig", "pub"}``: ``payload`` is the base64
(standard alphabet, padded) of the exact bytes signed, ``sig`` and ``pub``
are hex ed25519. The payload bytes are the canon: a verifier checks the
signature over them first and only then decodes them, so no canonical JSON
is needed. They decode to ``{"v": 1, "generatedAt", "listings"}``, the
listings ordered by uid and written as Go writes its ``SnapshotListing``
(``listings`` is ``null`` when there are none).

The signing key lives in ``snapshotkey.json`` in Go's format
(``{"pub": hex 32 bytes, "priv": hex 64 bytes (seed then public key)}``,
two-space indent, mode 0600), so a key file moves between a Go and a Python
directory unchanged.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from brmcp._ops import edkey, gojson

__all__ = [
    "SNAPSHOT_KEY_FILENAME",
    "SNAPSHOT_VERSION",
    "Signer",
    "Snapshot",
    "SnapshotError",
    "SnapshotListing",
    "build_payload",
    "verify_snapshot",
]

SNAPSHOT_VERSION = 1
SNAPSHOT_KEY_FILENAME = "snapshotkey.json"


class SnapshotError(ValueError):
    """A snapshot that does not verify or decode, or an unusable key file;
    the message says which check failed."""


@dataclass(frozen=True, slots=True)
class SnapshotListing:
    """One provider in a snapshot. ``catalog`` is the crawled tools array as
    compact JSON text (Go's ``json.RawMessage``; ``""`` is written as
    ``null``); times are unix seconds."""

    uid: str
    description: str
    catalog: str
    tags: tuple[str, ...] = ()
    catalog_checked_at: int = 0
    last_verified_execution: int = 0
    expires_at: int = 0

    def to_json_text(self) -> str:
        """The listing as Go's ``json.Marshal`` writes ``SnapshotListing``
        (key order, ``tags`` omitted when empty, the catalog's text as is)."""
        head: dict[str, Any] = {"uid": self.uid, "description": self.description}
        if self.tags:
            head["tags"] = list(self.tags)
        tail = {
            "catalogCheckedAt": self.catalog_checked_at,
            "lastVerifiedExecution": self.last_verified_execution,
            "expiresAt": self.expires_at,
        }
        catalog = self.catalog.strip() or "null"
        return f'{gojson.dumps(head)[:-1]},"catalog":{catalog},{gojson.dumps(tail)[1:]}'


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A verified, decoded snapshot: ``listings`` are the parsed listing
    objects (dicts with Go's keys) in payload order."""

    version: int
    generated_at: int
    listings: tuple[dict[str, Any], ...]


def build_payload(listings: Iterable[SnapshotListing], generated_at: int) -> bytes:
    """The bytes to sign: ``{"v":1,"generatedAt":...,"listings":[...]}``
    with the listings sorted by uid, exactly as Go's ``json.Marshal`` of
    ``Snapshot`` writes them."""
    ordered = sorted(listings, key=lambda item: item.uid)
    body = "null" if not ordered else "[" + ",".join(item.to_json_text() for item in ordered) + "]"
    return f'{{"v":{SNAPSHOT_VERSION},"generatedAt":{int(generated_at)},"listings":{body}}}'.encode()


class Signer:
    """The directory's ed25519 snapshot key."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public_hex = edkey.public_hex(private)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Signer:
        """Open the key file at ``path`` or, when it does not exist, create
        one (mode 0600, its directory 0700, written to a temporary name and
        renamed into place; :func:`brmcp._ops.edkey.load_or_create_key`).
        Raises :class:`SnapshotError` naming the file for a file that is not
        Go's key format or whose halves disagree."""
        try:
            return cls(edkey.load_or_create_key(path, "snapshot key"))
        except edkey.KeyFileError as exc:
            raise SnapshotError(str(exc)) from None

    def sign(self, payload: bytes) -> dict[str, str]:
        """The signed snapshot of ``payload``: ``{"payload": base64, "sig": hex, "pub": hex}``."""
        return {
            "payload": base64.b64encode(payload).decode("ascii"),
            "sig": self._private.sign(payload).hex(),
            "pub": self.public_hex,
        }

    def build_snapshot(self, listings: Sequence[SnapshotListing], generated_at: int) -> dict[str, str]:
        """:meth:`sign` of :func:`build_payload`."""
        return self.sign(build_payload(listings, generated_at))


def verify_snapshot(signed: Any, expected_pub: str) -> Snapshot:
    """Check ``signed`` (a parsed ``{"payload", "sig", "pub"}`` object)
    against ``expected_pub`` (hex; the trust root, e.g. the peer record
    from ``add_peer``), then decode it.

    Order (Go's ``VerifySnapshot``): a trusted key is required; ``pub`` must
    equal it; the signature is checked over the base64-decoded payload
    bytes; only then are they parsed, and ``v`` must be 1. Raises
    :class:`SnapshotError` naming the failed check.
    """
    if not expected_pub:
        raise SnapshotError("no trusted key for snapshot verification")
    if not isinstance(signed, dict):
        raise SnapshotError("snapshot malformed: expected a JSON object {payload, sig, pub}")
    pub_hex, sig_hex, payload_b64 = signed.get("pub"), signed.get("sig"), signed.get("payload")
    if not isinstance(pub_hex, str) or pub_hex != expected_pub:
        raise SnapshotError("snapshot signed by an unexpected key")
    try:
        pub = bytes.fromhex(pub_hex)
        key = Ed25519PublicKey.from_public_bytes(pub)
    except ValueError:
        raise SnapshotError("snapshot public key malformed") from None
    if not isinstance(sig_hex, str):
        raise SnapshotError("snapshot signature malformed")
    try:
        sig = bytes.fromhex(sig_hex)
    except ValueError:
        raise SnapshotError("snapshot signature malformed") from None
    if not isinstance(payload_b64, str):
        raise SnapshotError("snapshot payload malformed: expected a base64 string")
    try:
        payload = base64.b64decode(payload_b64, validate=True)
    except (binascii.Error, ValueError):
        raise SnapshotError("snapshot payload malformed: not base64") from None
    try:
        key.verify(sig, payload)
    except InvalidSignature:
        raise SnapshotError("snapshot signature invalid") from None
    try:
        decoded = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(f"snapshot payload corrupt: {exc}") from None
    if not isinstance(decoded, dict):
        raise SnapshotError("snapshot payload corrupt: not a JSON object")
    version = decoded.get("v")
    if version != SNAPSHOT_VERSION or isinstance(version, bool):
        raise SnapshotError(f"snapshot version {version!r} unsupported")
    generated = decoded.get("generatedAt")
    listings = decoded.get("listings")
    if listings is None:
        listings = []
    if not isinstance(listings, list) or not all(isinstance(item, dict) for item in listings):
        raise SnapshotError("snapshot payload corrupt: listings must be an array of objects")
    return Snapshot(
        version=SNAPSHOT_VERSION,
        generated_at=generated if isinstance(generated, int) and not isinstance(generated, bool) else 0,
        listings=tuple(listings),
    )
