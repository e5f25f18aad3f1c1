"""Ratings backed by signed receipts (docs/directory.md §Reputation): the
table and the rules behind the public ``rate`` and ``ratings`` tools
(registered by :mod:`brmcp.directory.tools._ratings`), extension tools of this
directory (the Go reference has neither).

A rating is accepted only with a signed receipt (WIRE.md §Signed receipts,
:mod:`brmcp.protocol.receipts`) that verifies against the receipt key the
directory itself crawled from the listed provider's ``tools/list``
(:mod:`brmcp.directory.db._reputation`), names the calling peer as its caller
(a receipt is no use to anyone else), names no other bot, is dated at most
:data:`MAX_FUTURE_SECONDS` after the directory's clock, and was never used
for a rating before (one rating per receipt, ever). A rater rates one
provider at most :data:`MAX_PER_DAY` times in any :data:`DAY_SECONDS`
window of the directory's clock. The receipt is stored as sent, so anyone
can verify a rating again from the ``ratings`` answer.

Table ``dir_ratings`` (the harness's database): one row per rating, its
``receipt_id`` (the SHA-256 of the receipt's payload bytes) unique; each
rating is written in one transaction with every check above.
"""

from __future__ import annotations

import sqlite3
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from brmcp.protocol.receipts import ReceiptError, verify_receipt

from ..model import ShapeError
from . import _reputation as reputation
from ._rows import get_listing

__all__ = [
    "DAY_SECONDS",
    "DEFAULT_LIMIT",
    "MAX_COMMENT",
    "MAX_FUTURE_SECONDS",
    "MAX_LIMIT",
    "MAX_PER_DAY",
    "RATE_SCHEMA",
    "RATINGS_SCHEMA",
    "RATING_TOOLS",
    "SCHEMA",
    "RateIn",
    "Rating",
    "RatingsIn",
    "clean_comment",
    "open_tables",
    "rate",
    "ratings_page",
]

#: Longest comment kept, in characters (after cleaning; longer is cut).
MAX_COMMENT = 280
#: How far a receipt's ``time`` may run ahead of the directory's clock (seconds).
MAX_FUTURE_SECONDS = 300
#: Ratings one rater may give one provider per :data:`DAY_SECONDS` window.
MAX_PER_DAY = 3
DAY_SECONDS = 86_400
#: ``ratings`` page size: default and bound.
DEFAULT_LIMIT = 20
MAX_LIMIT = 50

#: The tools, in registration order.
RATING_TOOLS = ("rate", "ratings")

SCHEMA = """
CREATE TABLE IF NOT EXISTS dir_ratings (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    receipt_id TEXT NOT NULL UNIQUE,
    provider   TEXT NOT NULL,
    rater      TEXT NOT NULL,
    stars      INTEGER NOT NULL CHECK (stars BETWEEN 1 AND 5),
    comment    TEXT NOT NULL,
    tool       TEXT NOT NULL,
    atoms      INTEGER NOT NULL CHECK (atoms >= 0),
    at         INTEGER NOT NULL,
    payload    TEXT NOT NULL,
    sig        TEXT NOT NULL,
    pub        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS dir_ratings_by_provider ON dir_ratings (provider, id);
CREATE INDEX IF NOT EXISTS dir_ratings_by_rater ON dir_ratings (provider, rater, at);
"""

RATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "provider": {"type": "string"},
        "receipt": {
            "type": "object",
            "properties": {
                "payload": {"type": "string"},
                "sig": {"type": "string"},
                "pub": {"type": "string"},
            },
            "required": ["payload", "sig", "pub"],
        },
        "stars": {"type": "integer"},
        "comment": {"type": "string"},
    },
    "required": ["provider", "receipt", "stars"],
    "additionalProperties": False,
}
RATINGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "provider": {"type": "string"},
        "limit": {"type": "integer"},
        "cursor": {"type": "string"},
    },
    "required": ["provider"],
    "additionalProperties": False,
}

_RECEIPT_FIELDS = ("payload", "sig", "pub")
_INT64_MAX = (1 << 63) - 1


def open_tables(conn: sqlite3.Connection) -> None:
    """Create ``dir_ratings`` when missing."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def clean_comment(text: str) -> str:
    """``text`` with every character that does not print (Unicode categories
    C*: controls, formats such as bidi overrides, surrogates, private use,
    unassigned; and the line and paragraph separators) turned into a space,
    runs of white space collapsed to one, trimmed and cut to
    :data:`MAX_COMMENT` characters. Only the first ``16 * MAX_COMMENT``
    characters are read."""
    kept = [
        " " if unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp") else ch
        for ch in text[: 16 * MAX_COMMENT]
    ]
    return " ".join("".join(kept).split())[:MAX_COMMENT].rstrip()


def _field(obj: Mapping[str, Any], key: str) -> Any:
    return obj.get(key)


@dataclass(frozen=True, slots=True)
class RateIn:
    """``rate``'s input: the provider's uid, the signed receipt
    ``{payload, sig, pub}`` (strings), ``stars`` 1..5, the comment (cleaned
    by :func:`clean_comment`)."""

    provider: str
    receipt: dict[str, str]
    stars: int
    comment: str = ""

    @classmethod
    def from_json(cls, value: Any) -> RateIn:
        """Raises :class:`ShapeError` naming the field that is wrong."""
        if not isinstance(value, Mapping):
            raise ShapeError("rate: expected a JSON object")
        provider = _field(value, "provider")
        if not isinstance(provider, str) or not provider:
            raise ShapeError("rate.provider: expected the provider's uid")
        receipt = _field(value, "receipt")
        if not isinstance(receipt, Mapping) or not all(
            isinstance(receipt.get(name), str) for name in _RECEIPT_FIELDS
        ):
            raise ShapeError("rate.receipt: expected the signed receipt {payload, sig, pub}, three strings")
        stars = _field(value, "stars")
        if isinstance(stars, float) and stars.is_integer():
            stars = int(stars)
        if isinstance(stars, bool) or not isinstance(stars, int) or not 1 <= stars <= 5:
            raise ShapeError(f"rate.stars: expected a whole number from 1 to 5, got {stars!r}"[:120])
        comment = _field(value, "comment")
        if comment is not None and not isinstance(comment, str):
            raise ShapeError("rate.comment: expected a string")
        return cls(
            provider=provider,
            receipt={name: str(receipt[name]) for name in _RECEIPT_FIELDS},
            stars=stars,
            comment=clean_comment(comment or ""),
        )


@dataclass(frozen=True, slots=True)
class RatingsIn:
    """``ratings``' input: the provider's uid, ``limit`` 1..:data:`MAX_LIMIT`
    (absent or 0: :data:`DEFAULT_LIMIT`), ``cursor`` a ``nextCursor``."""

    provider: str
    limit: int = DEFAULT_LIMIT
    cursor: str = ""

    @classmethod
    def from_json(cls, value: Any) -> RatingsIn:
        """Raises :class:`ShapeError` naming the field that is wrong."""
        if not isinstance(value, Mapping):
            raise ShapeError("ratings: expected a JSON object")
        provider = _field(value, "provider")
        if not isinstance(provider, str) or not provider:
            raise ShapeError("ratings.provider: expected the provider's uid")
        limit = _field(value, "limit")
        if limit is None or limit == 0:
            limit = DEFAULT_LIMIT
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise ShapeError(f"ratings.limit: expected a whole number from 1 to {MAX_LIMIT}")
        cursor = _field(value, "cursor")
        if cursor is None:
            cursor = ""
        if not isinstance(cursor, str) or (cursor and not (cursor.isascii() and cursor.isdigit())):
            raise ShapeError("ratings.cursor: expected a nextCursor of an earlier ratings answer")
        if len(cursor) > 19 or (cursor and int(cursor) > _INT64_MAX):
            raise ShapeError("ratings.cursor: expected a nextCursor of an earlier ratings answer")
        return cls(provider=provider, limit=int(limit), cursor=cursor)


@dataclass(frozen=True, slots=True)
class Rating:
    """One stored rating. ``at`` is when the directory accepted it (unix
    seconds, its clock); ``tool`` and ``atoms`` come from the receipt."""

    receipt_id: str
    provider: str
    rater: str
    stars: int
    comment: str
    tool: str
    atoms: int
    at: int
    receipt: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        """``{receiptId, rater, stars, comment (omitted when empty), time,
        tool, atoms, receipt: {payload, sig, pub}}``."""
        out: dict[str, Any] = {"receiptId": self.receipt_id, "rater": self.rater, "stars": self.stars}
        if self.comment:
            out["comment"] = self.comment
        out.update(time=self.at, tool=self.tool, atoms=self.atoms, receipt=dict(self.receipt))
        return out


def rate(conn: sqlite3.Connection, rater: str, request: RateIn, now: int) -> Rating:
    """Check and store one rating by ``rater`` (the calling peer) inside the
    caller's transaction, at ``now`` (the directory's clock, unix seconds).
    Raises ValueError with a one-line reason (nothing written) when the
    provider is not listed or announced no receipt key, the receipt does not
    verify against that key, was issued to another caller or by another
    bot, is dated more than :data:`MAX_FUTURE_SECONDS` ahead, was used for a
    rating before, or the rater reached :data:`MAX_PER_DAY` for this provider."""
    provider = request.provider
    if get_listing(conn, provider) is None:
        raise ValueError("no listing for that uid")
    key = reputation.listed_key(conn, provider)
    if not key:
        raise ValueError("the provider announced no receipt key; its receipts cannot be checked")
    try:
        claims = verify_receipt(request.receipt, key)
    except ReceiptError as exc:
        raise ValueError(f"receipt refused: {exc}") from None
    if claims.caller != rater:
        raise ValueError("receipt refused: it was issued to another caller")
    if claims.bot and claims.bot != provider:
        raise ValueError("receipt refused: it names another bot")
    if rater == provider:
        raise ValueError("a provider cannot rate itself")
    if claims.time > now + MAX_FUTURE_SECONDS:
        raise ValueError(
            f"receipt refused: dated {claims.time - now}s after the directory's clock "
            f"(at most {MAX_FUTURE_SECONDS}s)"
        )
    if conn.execute("SELECT 1 FROM dir_ratings WHERE receipt_id = ?", (claims.receipt_id,)).fetchone():
        raise ValueError(f"receipt {claims.receipt_id} was already used for a rating")
    recent = [
        int(r[0])
        for r in conn.execute(
            "SELECT at FROM dir_ratings WHERE provider = ? AND rater = ? AND at > ? ORDER BY at",
            (provider, rater, now - DAY_SECONDS),
        )
    ]
    if len(recent) >= MAX_PER_DAY:
        raise ValueError(
            f"at most {MAX_PER_DAY} ratings of one provider per day; the next is accepted from "
            f"{recent[-MAX_PER_DAY] + DAY_SECONDS}"
        )
    rating = Rating(
        receipt_id=claims.receipt_id,
        provider=provider,
        rater=rater,
        stars=request.stars,
        comment=request.comment,
        tool=claims.tool,
        atoms=claims.atoms,
        at=now,
        receipt=dict(request.receipt),
    )
    conn.execute(
        "INSERT INTO dir_ratings (receipt_id, provider, rater, stars, comment, tool, atoms, at, "
        "payload, sig, pub) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            rating.receipt_id,
            provider,
            rater,
            rating.stars,
            rating.comment,
            rating.tool,
            rating.atoms,
            now,
            request.receipt["payload"],
            request.receipt["sig"],
            request.receipt["pub"],
        ),
    )
    return rating


def ratings_page(conn: sqlite3.Connection, request: RatingsIn) -> dict[str, Any]:
    """``ratings``' answer: ``{ratings: [Rating JSON] (newest first, at most
    ``limit``), total, nextCursor (present only when more follow)}``. A
    rating added between pages does not shift the next page."""
    params: list[Any] = [request.provider]
    sql = (
        "SELECT id, receipt_id, rater, stars, comment, tool, atoms, at, payload, sig, pub "
        "FROM dir_ratings WHERE provider = ?"
    )
    if request.cursor:
        sql += " AND id < ?"
        params.append(int(request.cursor))
    rows = conn.execute(sql + " ORDER BY id DESC LIMIT ?", (*params, request.limit + 1)).fetchall()
    page = rows[: request.limit]
    items = [
        Rating(
            receipt_id=r[1],
            provider=request.provider,
            rater=r[2],
            stars=int(r[3]),
            comment=r[4],
            tool=r[5],
            atoms=int(r[6]),
            at=int(r[7]),
            receipt={"payload": r[8], "sig": r[9], "pub": r[10]},
        ).to_json()
        for r in page
    ]
    (total,) = conn.execute(
        "SELECT COUNT(*) FROM dir_ratings WHERE provider = ?", (request.provider,)
    ).fetchone()
    out: dict[str, Any] = {"ratings": items, "total": int(total)}
    if len(rows) > request.limit:
        out["nextCursor"] = str(page[-1][0])
    return out
