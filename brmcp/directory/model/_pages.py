"""Signed snapshots in pages, and the changes since one (docs/directory.md
§Snapshot pages). An extension of this directory: the Go reference
(karamble/brmcp, ``directory/snapshot.go``) sells the whole index as one
``get_snapshot`` message, which it keeps doing here unchanged; a large
index (100k listings) does not fit one message (WIRE.md §Reassembly bounds:
16 MiB), so it is also sold as a manifest plus pages.

Every signed object is ``{"payload", "sig", "pub"}`` as in
:mod:`brmcp.directory.model._snapshot`: the payload bytes are the canon, the
signature is checked over them before they are decoded.

* The **manifest** payload: ``{"v": 1, "generatedAt", "pageSize",
  "pages": [{"index", "count", "sha256", "firstUid", "lastUid"}], "total",
  "pub"}``. ``pageSize`` is the bound in bytes of one page payload,
  ``sha256`` the hex SHA-256 of that page's payload bytes, ``total`` the
  number of listings, ``pub`` the signing key (hex).
* A **page** payload: ``{"v": 1, "generatedAt", "page", "listings"}``, the
  listings ordered by uid, each written exactly as in the full snapshot.
  A page is accepted only when its signature verifies with the manifest's
  key and its SHA-256 is the one the manifest lists at its index, so a page
  of another generation or another directory is refused.
* **Changes**: ``{"v": 1, "since", "generatedAt", "upserts", "removals"}``:
  the listings changed since ``since`` that are live now, and the uids
  removed (expired or unlisted) since then that are not live now. Applying
  them to a copy taken at ``since`` gives the index at ``generatedAt``.

This module is the formats, their verification and the consumer
(:class:`SnapshotMirror`); the directory's side, which sells them and keeps
the removal times changes answer from, is :mod:`brmcp.directory.db._pagetables`.

Times are unix seconds, sizes bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from brmcp._ops import gojson

from ._snapshot import Signer, SnapshotError, SnapshotListing

__all__ = [
    "PAGES_VERSION",
    "PAGE_MAX_BYTES",
    "Changes",
    "Generation",
    "Manifest",
    "PageRef",
    "PagesError",
    "PagesRefused",
    "SnapshotMirror",
    "build_changes_payload",
    "build_generation",
    "fetch_pages",
    "verify_changes",
    "verify_manifest",
    "verify_page",
]

PAGES_VERSION = 1
#: The bound of one page payload. A tool answer carries the signed page
#: twice (structured content and its text) and base64 adds a third, so a
#: 1 MiB page is about 2.7 MiB on the wire, well under the 16 MiB message
#: bound. A single listing larger than this is a page of its own.
PAGE_MAX_BYTES = 1 << 20

_SHA_HEX = frozenset("0123456789abcdef")


class PagesError(SnapshotError):
    """A manifest, page or changes answer that does not verify or decode,
    or a set of pages that does not make a whole index; the message says
    which check failed."""


class PagesRefused(Exception):
    """A tool error from the directory (its text is the message), raised by
    a consumer's fetch function for :class:`SnapshotMirror`."""


# -- building ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PageRef:
    """One page as the manifest lists it (``sha256``: hex of the page
    payload's SHA-256)."""

    index: int
    count: int
    sha256: str
    first_uid: str
    last_uid: str

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "count": self.count,
            "sha256": self.sha256,
            "firstUid": self.first_uid,
            "lastUid": self.last_uid,
        }


@dataclass(frozen=True, slots=True)
class Manifest:
    """A verified manifest."""

    version: int
    generated_at: int
    page_size: int
    pages: tuple[PageRef, ...]
    total: int
    pub: str


def _page_payload(generated_at: int, index: int, texts: Sequence[str]) -> bytes:
    body = ",".join(texts)
    return f'{{"v":{PAGES_VERSION},"generatedAt":{generated_at},"page":{index},"listings":[{body}]}}'.encode()


def _split(
    listings: Sequence[SnapshotListing], generated_at: int, max_bytes: int
) -> list[tuple[bytes, list[str]]]:
    """Page payloads and their uids: listings in uid order, as many per
    page as keep the payload within ``max_bytes`` (at least one)."""
    ordered = sorted(listings, key=lambda item: item.uid)
    pages: list[tuple[bytes, list[str]]] = []
    texts: list[str] = []
    uids: list[str] = []
    head = len(_page_payload(generated_at, 0, ()))
    size = head
    for item in ordered:
        text = item.to_json_text()
        length = len(text.encode())
        if texts and size + 1 + length > max_bytes:
            pages.append((_page_payload(generated_at, len(pages), texts), uids))
            texts, uids = [], []
            size = len(_page_payload(generated_at, len(pages), ()))
        size += length + (1 if texts else 0)
        texts.append(text)
        uids.append(item.uid)
    if texts:
        pages.append((_page_payload(generated_at, len(pages), texts), uids))
    return pages


@dataclass(slots=True)
class Generation:
    """One built generation: the signed manifest and pages, and who bought it."""

    generated_at: int
    manifest: dict[str, str]
    pages: tuple[dict[str, str], ...]
    buyers: set[str] = field(default_factory=set)


def build_generation(
    signer: Signer, listings: Sequence[SnapshotListing], generated_at: int, *, max_bytes: int = PAGE_MAX_BYTES
) -> Generation:
    """Sign the pages of ``listings`` at ``generated_at`` and the manifest
    naming them (CPU-bound: run it off the event loop)."""
    split = _split(listings, int(generated_at), max_bytes)
    refs = [
        PageRef(i, len(uids), hashlib.sha256(payload).hexdigest(), uids[0], uids[-1]).to_json()
        for i, (payload, uids) in enumerate(split)
    ]
    manifest = {
        "v": PAGES_VERSION,
        "generatedAt": int(generated_at),
        "pageSize": max_bytes,
        "pages": refs,
        "total": sum(len(uids) for _, uids in split),
        "pub": signer.public_hex,
    }
    return Generation(
        generated_at=int(generated_at),
        manifest=signer.sign(gojson.dumps(manifest).encode()),
        pages=tuple(signer.sign(payload) for payload, _ in split),
    )


def build_changes_payload(
    since: int, generated_at: int, upserts: Iterable[SnapshotListing], removals: Iterable[str]
) -> bytes:
    """The bytes to sign for a changes answer (upserts by uid, removals sorted)."""
    ups = ",".join(item.to_json_text() for item in sorted(upserts, key=lambda item: item.uid))
    gone = gojson.dumps(sorted(removals))
    return (
        f'{{"v":{PAGES_VERSION},"since":{int(since)},"generatedAt":{int(generated_at)},'
        f'"upserts":[{ups}],"removals":{gone}}}'
    ).encode()


# -- verifying ---------------------------------------------------------------------


def _open(signed: Any, expected_pub: str, what: str) -> bytes:
    """The payload bytes of ``signed`` once its key is ``expected_pub`` and
    its signature verifies over them; raises :class:`PagesError`."""
    if not expected_pub:
        raise PagesError(f"no trusted key for {what} verification")
    if not isinstance(signed, dict):
        raise PagesError(f"{what} malformed: expected a JSON object {{payload, sig, pub}}")
    pub_hex, sig_hex, payload_b64 = signed.get("pub"), signed.get("sig"), signed.get("payload")
    if not isinstance(pub_hex, str) or pub_hex != expected_pub:
        raise PagesError(f"{what} signed by an unexpected key")
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub_hex))
    except ValueError:
        raise PagesError(f"{what} public key malformed") from None
    try:
        sig = bytes.fromhex(sig_hex) if isinstance(sig_hex, str) else b""
        payload = base64.b64decode(payload_b64, validate=True) if isinstance(payload_b64, str) else None
    except (binascii.Error, ValueError):
        raise PagesError(f"{what} signature or payload malformed") from None
    if payload is None or not sig:
        raise PagesError(f"{what} signature or payload malformed")
    try:
        key.verify(sig, payload)
    except InvalidSignature:
        raise PagesError(f"{what} signature invalid") from None
    return payload


def _decode(payload: bytes, what: str) -> dict[str, Any]:
    try:
        decoded = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise PagesError(f"{what} payload corrupt: {exc}") from None
    if not isinstance(decoded, dict):
        raise PagesError(f"{what} payload corrupt: not a JSON object")
    version = decoded.get("v")
    if version != PAGES_VERSION or isinstance(version, bool):
        raise PagesError(f"{what} version {version!r} unsupported")
    return decoded


def _int(value: Any, what: str, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PagesError(f"{what} payload corrupt: {key} must be a non-negative integer")
    return value


def _listings(value: Any, what: str) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not all(
        isinstance(item, dict) and isinstance(item.get("uid"), str) for item in value
    ):
        raise PagesError(f"{what} payload corrupt: listings must be objects with a string uid")
    uids = [item["uid"] for item in value]
    if any(a >= b for a, b in itertools.pairwise(uids)):
        raise PagesError(f"{what} payload corrupt: listings not in strictly increasing uid order")
    return tuple(value)


def verify_manifest(signed: Any, expected_pub: str) -> Manifest:
    """Check a signed manifest against ``expected_pub`` (hex; the trust
    root), then decode and check its page list. Raises :class:`PagesError`."""
    decoded = _decode(_open(signed, expected_pub, "manifest"), "manifest")
    if decoded.get("pub") != expected_pub:
        raise PagesError("manifest payload names another key")
    raw_pages = decoded.get("pages")
    if not isinstance(raw_pages, list):
        raise PagesError("manifest payload corrupt: pages must be an array")
    refs: list[PageRef] = []
    for position, raw in enumerate(raw_pages):
        if not isinstance(raw, dict):
            raise PagesError(f"manifest payload corrupt: page {position} is not an object")
        sha = raw.get("sha256")
        first, last = raw.get("firstUid"), raw.get("lastUid")
        if not isinstance(sha, str) or len(sha) != 64 or not _SHA_HEX.issuperset(sha):
            raise PagesError(f"manifest payload corrupt: page {position} sha256 is not 64 hex digits")
        if not isinstance(first, str) or not isinstance(last, str):
            raise PagesError(f"manifest payload corrupt: page {position} firstUid/lastUid must be strings")
        ref = PageRef(
            _int(raw.get("index"), "manifest", "index"),
            _int(raw.get("count"), "manifest", "count"),
            sha,
            first,
            last,
        )
        if ref.index != position or ref.count < 1:
            raise PagesError(
                f"manifest payload corrupt: page {position} has index {ref.index}, count {ref.count}"
            )
        if refs and refs[-1].last_uid >= ref.first_uid:
            raise PagesError(f"manifest payload corrupt: page {position} overlaps the page before")
        refs.append(ref)
    total = _int(decoded.get("total"), "manifest", "total")
    if total != sum(ref.count for ref in refs):
        raise PagesError(f"manifest payload corrupt: total {total} is not the sum of the page counts")
    return Manifest(
        version=PAGES_VERSION,
        generated_at=_int(decoded.get("generatedAt"), "manifest", "generatedAt"),
        page_size=_int(decoded.get("pageSize"), "manifest", "pageSize"),
        pages=tuple(refs),
        total=total,
        pub=expected_pub,
    )


def verify_page(signed: Any, manifest: Manifest, index: int) -> tuple[dict[str, Any], ...]:
    """The listings of page ``index`` of ``manifest``: its signature must
    verify with the manifest's key and its payload's SHA-256 must be the
    manifest's for that index (a page of another generation or directory
    fails here), then its content must agree with the manifest's entry.
    Raises :class:`PagesError`."""
    if not 0 <= index < len(manifest.pages):
        raise PagesError(f"page {index} is not in the manifest ({len(manifest.pages)} pages)")
    what = f"page {index}"
    payload = _open(signed, manifest.pub, what)
    ref = manifest.pages[index]
    if hashlib.sha256(payload).hexdigest() != ref.sha256:
        raise PagesError(f"{what} does not match the manifest's sha256 (another generation or directory)")
    decoded = _decode(payload, what)
    if decoded.get("generatedAt") != manifest.generated_at or decoded.get("page") != index:
        raise PagesError(f"{what} payload names another generation or page")
    listings = _listings(decoded.get("listings"), what)
    if (
        len(listings) != ref.count
        or listings[0]["uid"] != ref.first_uid
        or listings[-1]["uid"] != ref.last_uid
    ):
        raise PagesError(f"{what} listings disagree with the manifest's count or uid range")
    return listings


@dataclass(frozen=True, slots=True)
class Changes:
    """A verified changes answer."""

    since: int
    generated_at: int
    upserts: tuple[dict[str, Any], ...]
    removals: tuple[str, ...]


def verify_changes(signed: Any, expected_pub: str) -> Changes:
    """Check a signed changes answer against ``expected_pub``, then decode
    it. Raises :class:`PagesError`."""
    decoded = _decode(_open(signed, expected_pub, "changes"), "changes")
    since = _int(decoded.get("since"), "changes", "since")
    generated = _int(decoded.get("generatedAt"), "changes", "generatedAt")
    if generated < since:
        raise PagesError(f"changes payload corrupt: generatedAt {generated} is before since {since}")
    removals = decoded.get("removals")
    if not isinstance(removals, list) or not all(isinstance(uid, str) for uid in removals):
        raise PagesError("changes payload corrupt: removals must be an array of uid strings")
    upserts = _listings(decoded.get("upserts"), "changes")
    if {item["uid"] for item in upserts} & set(removals):
        raise PagesError("changes payload corrupt: a uid is both upserted and removed")
    return Changes(since, generated, upserts, tuple(removals))


# -- the consumer --------------------------------------------------------------------

#: ``fetch(tool, args)``: call the directory's tool and return its parsed
#: structured answer; a tool error is raised as :class:`PagesRefused`.
Fetch = Callable[[str, dict[str, Any]], Awaitable[Any]]


class SnapshotMirror:
    """A local copy of one directory's index, trusted to ``expected_pub``
    (hex): loaded from a manifest and its pages, kept fresh by changes.
    ``generated_at`` is 0 until the first load."""

    def __init__(self, expected_pub: str) -> None:
        self.expected_pub = expected_pub
        self.generated_at = 0
        self.listings: dict[str, dict[str, Any]] = {}

    def load(self, signed_manifest: Any, signed_pages: Sequence[Any]) -> Manifest:
        """Replace the copy with a verified manifest and all its pages (in
        index order). Raises :class:`PagesError` for a missing, extra or
        failing page; the copy is unchanged then."""
        manifest = verify_manifest(signed_manifest, self.expected_pub)
        if len(signed_pages) != len(manifest.pages):
            raise PagesError(f"got {len(signed_pages)} pages, the manifest lists {len(manifest.pages)}")
        fresh: dict[str, dict[str, Any]] = {}
        for index, signed in enumerate(signed_pages):
            for item in verify_page(signed, manifest, index):
                fresh[item["uid"]] = item
        self.listings = fresh
        self.generated_at = manifest.generated_at
        return manifest

    def apply(self, signed_changes: Any) -> Changes:
        """Apply a verified changes answer whose ``since`` reaches back to
        the copy (``since <= generated_at``) and which is not older than it.
        Raises :class:`PagesError` otherwise; the copy is unchanged then."""
        changes = verify_changes(signed_changes, self.expected_pub)
        if not self.generated_at:
            raise PagesError("no copy to apply changes to: load the pages first")
        if changes.since > self.generated_at:
            raise PagesError(
                f"changes since {changes.since} leave a gap after the copy of {self.generated_at}"
            )
        if changes.generated_at < self.generated_at:
            raise PagesError(
                f"changes of {changes.generated_at} are older than the copy of {self.generated_at}"
            )
        for uid in changes.removals:
            self.listings.pop(uid, None)
        for item in changes.upserts:
            self.listings[item["uid"]] = item
        self.generated_at = changes.generated_at
        return changes

    def snapshot(self) -> tuple[dict[str, Any], ...]:
        """The copy's listings ordered by uid."""
        return tuple(self.listings[uid] for uid in sorted(self.listings))

    async def pages_of(self, fetch: Fetch, signed_manifest: Any) -> list[Any]:
        """Every page of a signed manifest, fetched in index order
        (``get_snapshot_page`` with ``{index, generatedAt}``), not yet
        verified (:meth:`load` does). Raises :class:`PagesError` for a
        manifest that does not verify."""
        manifest = verify_manifest(signed_manifest, self.expected_pub)
        return [
            await fetch("get_snapshot_page", {"index": i, "generatedAt": manifest.generated_at})
            for i in range(len(manifest.pages))
        ]

    async def fetch_all(self, fetch: Fetch) -> Manifest:
        """Buy the manifest, fetch every page and :meth:`load` them."""
        signed_manifest = await fetch("get_snapshot_manifest", {})
        return self.load(signed_manifest, await self.pages_of(fetch, signed_manifest))

    async def refresh(self, fetch: Fetch) -> str:
        """Bring the copy up to date: ``"changes"`` when a changes answer
        did, ``"pages"`` when the directory refused changes (too old, too
        many, no manifest bought) or there was no copy, and the manifest and
        pages were fetched. Raises :class:`PagesError` for an answer that
        fails verification and :class:`PagesRefused` for a refused fetch of
        the manifest or a page."""
        if self.generated_at:
            try:
                signed = await fetch("get_snapshot_changes", {"since": self.generated_at})
            except PagesRefused:
                pass
            else:
                self.apply(signed)
                return "changes"
        await self.fetch_all(fetch)
        return "pages"


async def fetch_pages(fetch: Fetch, expected_pub: str) -> SnapshotMirror:
    """A new :class:`SnapshotMirror` loaded through ``fetch`` (see
    :meth:`SnapshotMirror.fetch_all`)."""
    mirror = SnapshotMirror(expected_pub)
    await mirror.fetch_all(fetch)
    return mirror
