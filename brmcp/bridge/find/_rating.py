"""Rating a bot at the directories with a signed receipt the bridge kept
(BRIDGE.md §Signed receipts, "Rating"; docs/directory.md §Reputation).

The user names a receipt of the receipt book (:mod:`.receipts`) by its id
or the first characters of it (at least :data:`MIN_PREFIX`, as the
``receipts`` command prints them); the bridge sends it, with the stars and
the comment, to the ``rate`` tool of one directory (``directory``) or of
every configured directory at once, each a call through the bot path under
the bridge's caps like any directory call. A directory accepts a receipt
once, only from the caller it names, and only when it verifies against
the key it crawled from the provider, so the bridge refuses up front a
receipt that failed any of its own checks: no directory would take it,
and the stars would go nowhere.

Answers are :class:`RateResult`: per directory ``rated`` (its message),
``refused`` (its one-line reason, e.g. "already used"), ``unreachable``,
``timeout`` or ``failed``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from brmcp.bridge.base import is_uid

from ._contacts import ContactsUnavailable
from ._discovery import Discovery, DiscoveryError, DiscoveryHost
from ._receipts import ReceiptBook, StoredReceipt

__all__ = [
    "MAX_COMMENT_CHARS",
    "MIN_PREFIX",
    "RATE_TIMEOUT",
    "DirectoryRating",
    "RateResult",
    "rate_receipt",
    "resolve_receipt",
]

#: Fewest hex characters of a receipt id the user may give.
MIN_PREFIX = 8
#: Longest comment sent (characters); the directory cuts to its own bound.
MAX_COMMENT_CHARS = 280
#: Wall seconds one directory's ``rate`` may take (plus
#: ``approval_timeout_secs`` in approval mode, should a directory price it).
RATE_TIMEOUT = 60.0
#: Longest text kept of a directory's answer (characters).
_ANSWER_CHARS = 300

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DirectoryRating:
    """One directory's answer: ``outcome`` is ``rated``, ``refused``,
    ``unreachable``, ``timeout`` or ``failed``; ``message`` its text
    (cut, characters that do not print removed: the directory chose it)."""

    directory: str
    outcome: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """``{"directory", "outcome", "message"}``."""
        return {"directory": self.directory, "outcome": self.outcome, "message": self.message}


@dataclass(slots=True)
class RateResult:
    """The rating of receipt ``receipt_id`` (of bot ``provider``) at each
    directory asked, in the order asked."""

    receipt_id: str
    provider: str
    results: list[DirectoryRating] = field(default_factory=list)

    @property
    def rated(self) -> bool:
        """True when at least one directory took the rating."""
        return any(item.outcome == "rated" for item in self.results)

    def to_dict(self) -> dict[str, Any]:
        """``{"receiptId", "provider", "rated", "results": [...]}``."""
        return {
            "receiptId": self.receipt_id,
            "provider": self.provider,
            "rated": self.rated,
            "results": [item.to_dict() for item in self.results],
        }


def _clean(text: str, limit: int = _ANSWER_CHARS) -> str:
    kept = "".join(ch if ch.isprintable() else " " for ch in text[: 4 * limit])
    return " ".join(kept.split())[:limit]


def resolve_receipt(book: ReceiptBook, ref: str) -> StoredReceipt:
    """The receipt of ``book`` that ``ref`` names: its full id or a prefix of
    at least :data:`MIN_PREFIX` hex characters matching exactly one
    receipt. Blocking (run it off the event loop). Raises
    :class:`~.discovery.DiscoveryError`: 400 for a malformed ``ref``, 404
    when none matches, 409 when several do or the receipt failed a check."""
    ref = ref.strip().lower()
    if not MIN_PREFIX <= len(ref) <= 64 or not set(ref) <= set("0123456789abcdef"):
        raise DiscoveryError(
            400, f"receipt: {ref[:70]!r} is not a receipt id (at least {MIN_PREFIX} hex characters)"
        )
    found = book.by_prefix(ref, limit=2)
    if not found:
        raise DiscoveryError(404, f"no receipt {ref} in the receipt book (see: receipts)")
    if len(found) > 1:
        raise DiscoveryError(409, f"receipt id {ref} matches several receipts: give more of it")
    stored = found[0]
    if stored.claims is None or stored.checks:
        failed = ", ".join(stored.checks) or "signature"
        raise DiscoveryError(
            409,
            f"receipt {stored.receipt_id[:12]} failed the bridge's checks ({failed}); "
            "a directory accepts only receipts that verify",
        )
    return stored


def _answer_text(result: CallToolResult) -> str:
    for item in result.content:
        text = getattr(item, "text", None)
        if isinstance(text, str):
            return _clean(text)
    return ""


async def rate_receipt(
    discovery: Discovery,
    stored: StoredReceipt,
    *,
    stars: int,
    comment: str = "",
    directory: str | None = None,
    wait_secs: float = RATE_TIMEOUT,
) -> RateResult:
    """Send ``stored`` (a receipt that passed every check,
    :func:`resolve_receipt`) with ``stars`` (1 to 5) and ``comment`` (at
    most :data:`MAX_COMMENT_CHARS`) to the ``rate`` tool of ``directory``
    (one of the configured directories) or of every configured directory at
    once. Never raises for one directory's failure: its
    :class:`DirectoryRating` says it. Raises
    :class:`~.discovery.DiscoveryError`: 400 for bad stars, comment or
    ``directory``, 409 when no directory is configured."""
    if isinstance(stars, bool) or not isinstance(stars, int) or not 1 <= stars <= 5:
        raise DiscoveryError(400, f"stars: {stars!r} must be a whole number from 1 to 5")
    if len(comment) > MAX_COMMENT_CHARS:
        raise DiscoveryError(400, f"comment: at most {MAX_COMMENT_CHARS} characters, got {len(comment)}")
    host = discovery.host
    directories = discovery.directories()
    if directory is not None:
        directory = directory.lower()
        if not is_uid(directory):
            raise DiscoveryError(400, f"directory: {directory[:70]!r} is not a 64-hex directory uid")
        if directory not in directories:
            raise DiscoveryError(
                400,
                f"directory: {directory} is not on directories ({', '.join(directories)}); add it with: "
                f"{host.cli_command} settings set directories=<the uids now>,{directory}",
            )
        directories = (directory,)
    args: dict[str, Any] = {"provider": stored.bot, "receipt": dict(stored.signed), "stars": stars}
    if comment:
        args["comment"] = comment
    settings = host.settings
    limit = wait_secs + (0 if settings.autopay else settings.approval_timeout_secs)
    answers: dict[str, DirectoryRating] = {}

    async def ask(uid: str) -> None:
        answers[uid] = await _rate_at(discovery, host, uid, args, limit)

    async with anyio.create_task_group() as tg:
        for uid in directories:
            if uid != stored.bot:
                tg.start_soon(ask, uid)
    return RateResult(
        receipt_id=stored.receipt_id,
        provider=stored.bot,
        results=[answers[uid] for uid in directories if uid in answers],
    )


async def _rate_at(
    discovery: Discovery, host: DiscoveryHost, directory: str, args: dict[str, Any], limit: float
) -> DirectoryRating:
    try:
        if await discovery.contact(directory) is False:
            return DirectoryRating(
                directory, "unreachable", f"directory {directory} is not a contact of your brclient"
            )
    except ContactsUnavailable as exc:
        return DirectoryRating(directory, "unreachable", _clean(str(exc)))
    result: CallToolResult | None = None
    try:
        with anyio.move_on_after(limit):
            result = await host._proxy(directory).call("rate", args)
    except MCPError as exc:
        return DirectoryRating(directory, "unreachable", _clean(str(exc)))
    except Exception as exc:
        # One directory's failure must not end the others' answers.
        log.exception("rate at directory %s failed", directory)
        return DirectoryRating(directory, "failed", _clean(str(exc) or type(exc).__name__))
    if result is None:
        return DirectoryRating(
            directory, "timeout", f"no answer within {limit:.0f} s; the call was cancelled"
        )
    if result.is_error:
        return DirectoryRating(directory, "refused", _answer_text(result) or "refused, no reason given")
    return DirectoryRating(directory, "rated", _rated_text(result))


def _rated_text(result: CallToolResult) -> str:
    """A short line for an accepted rating: ``N star(s) for <tool> (<atoms>
    atoms)`` from the answer's ``rating`` object, else ``"rated"``."""
    content = result.structured_content
    rating = content.get("rating") if isinstance(content, dict) else None
    if not isinstance(rating, dict):
        return "rated"
    stars, tool, atoms = rating.get("stars"), rating.get("tool"), rating.get("atoms")
    if not (isinstance(stars, int) and isinstance(tool, str) and isinstance(atoms, int)):
        return "rated"
    return _clean(f"{stars} star{'s' if stars != 1 else ''} for {tool} ({atoms:,} atoms)")


async def rate_handler(
    discovery: Discovery,
    book: ReceiptBook,
    parts: list[str],
    method: str,
    receive: Any,
    send: Any,
) -> bool:
    """Serve ``POST /admin/rate`` with ``{"receipt": id or prefix, "stars":
    1..5, "comment"?: string, "directory"?: uid}`` → :meth:`RateResult.to_dict`
    (200 even when every directory refused: each says why). False when the
    path is not ``rate``. Errors are ``{"error"}``: 400 bad body, 404
    unknown receipt, 405 not POST, 409 ambiguous or failed receipt or no
    directory configured."""
    from brmcp.bridge.base import send_json

    from ._requests import read_json_object

    if parts != ["rate"]:
        return False
    if method != "POST":
        await send_json(send, 405, {"error": "use POST"})
        return True
    body = await read_json_object(receive, send)
    if body is None:
        return True
    allowed = {"receipt", "stars", "comment", "directory"}
    try:
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise DiscoveryError(400, f"rate: unknown key {unknown[0]!r}; keys: {', '.join(sorted(allowed))}")
        ref, comment, directory = body.get("receipt"), body.get("comment", ""), body.get("directory")
        if not isinstance(ref, str):
            raise DiscoveryError(400, "rate: receipt must be a receipt id (a string of hex characters)")
        if not isinstance(comment, str):
            raise DiscoveryError(400, "rate: comment must be a string")
        if directory is not None and not isinstance(directory, str):
            raise DiscoveryError(400, "rate: directory must be a directory uid")
        stars: Any = body.get("stars")
        stored = await anyio.to_thread.run_sync(resolve_receipt, book, ref)
        result = await rate_receipt(discovery, stored, stars=stars, comment=comment, directory=directory)
    except DiscoveryError as exc:
        await send_json(send, exc.status, {"error": str(exc)})
        return True
    await send_json(send, 200, result.to_dict())
    return True
