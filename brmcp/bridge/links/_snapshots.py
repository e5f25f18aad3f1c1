"""Per-bot snapshots that survive restarts: the bot's tool list, the MCP
era it speaks and the capabilities it declared (BRIDGE.md §Eras and snapshots).

One file per bot, ``<data_dir>/mcpsnapshots/<uid>.json``, written
atomically with mode 0600 (the directory 0700)::

    {"bot": "<64 hex>", "era": "modern", "protocol_version": "2026-07-28",
     "capabilities": {...} | null, "tools": [...], "marks_refusals": false,
     "updated": 1800000000, "rtt": {"srtt": 3.3, "rttvar": 1.1}}

``era`` is ``"modern"`` (2026-07-28: no initialize, an envelope per
request) or ``"handshake"`` (initialize first: the Go reference and older
SDKs). ``marks_refusals`` (absent in older files: false) is true when the
bot's last tool list said ``"brmcp/marksRefusals": true``
(:data:`brmcp.protocol.payment.MARKS_REFUSALS_KEY`). ``rtt`` (absent in older files,
and when nothing was measured) is the round trip last measured to the bot,
``SRTT`` and ``RTTVAR`` in seconds: the first guess of the next run's
re-send timer (BRIDGE.md §Deadlines and re-sends); one that is not two
finite numbers >= 0 is ignored (only it). A missing, unreadable,
malformed or oversized (over :data:`MAX_SNAPSHOT_BYTES`) file is no
snapshot: the bridge asks the bot again (it never fails to start because
of one).
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic
from mcp.types import ServerCapabilities, Tool

from brmcp.bridge.base import write_atomic
from brmcp.protocol.pool import PoolAnnouncement

__all__ = [
    "ERA_HANDSHAKE",
    "ERA_MODERN",
    "MAX_SNAPSHOT_BYTES",
    "SNAPSHOT_DIR",
    "BotSnapshot",
    "Era",
    "ListedTools",
    "SnapshotStore",
    "SnapshotTooLarge",
]

log = logging.getLogger("brmcp.bridge")

#: Directory (inside the bridge's data directory) holding one file per bot.
SNAPSHOT_DIR = "mcpsnapshots"
#: The bot answers 2026-07-28 requests: no initialize, an envelope per request.
ERA_MODERN: Literal["modern"] = "modern"
#: The bot needs the initialize handshake first.
ERA_HANDSHAKE: Literal["handshake"] = "handshake"
Era = Literal["modern", "handshake"]
#: Largest snapshot file read or written (bytes). A larger file is ignored
#: (logged) without being read; a snapshot whose JSON would be larger is not
#: written (logged; the file in place stays). Twice the bound on one tool
#: list (:data:`~._linkbase.MAX_TOOL_LIST_BYTES`, 4 MiB), so every list the
#: bridge accepts fits with its capabilities and header.
MAX_SNAPSHOT_BYTES = 8 * 1024 * 1024


class SnapshotTooLarge(ValueError):
    """A snapshot over :data:`MAX_SNAPSHOT_BYTES` (file or JSON to write)."""


class ListedTools(list[Tool]):
    """A bot's tools (a list of :class:`~mcp.types.Tool`) with what its
    list said about itself: ``marks_refusals``, true when the list's
    ``_meta`` carried ``"brmcp/marksRefusals": true``
    (:data:`brmcp.protocol.payment.MARKS_REFUSALS_KEY`), and ``receipt_key``,
    the receipt key it announced (``brmcp/receiptKey``, 64 hex; WIRE.md
    §Signed receipts), None when none (nor in a snapshot file: the
    receipt book pins it, :mod:`.receipts`), and ``pool``, the bot's
    ``brmcp/pool`` announcement (WIRE.md §Pools), None when none (nor in a
    snapshot file: membership is learnt from a live list only)."""

    __slots__ = ("marks_refusals", "pool", "receipt_key")

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        marks_refusals: bool = False,
        receipt_key: str | None = None,
        pool: PoolAnnouncement | None = None,
    ) -> None:
        super().__init__(tools)
        self.marks_refusals = marks_refusals
        self.receipt_key = receipt_key
        self.pool = pool


@dataclass(slots=True)
class BotSnapshot:
    """What the bridge remembers of one bot: ``bot`` (lowercase uid),
    ``era``, ``protocol_version`` (the version last used with it),
    ``capabilities`` (None when the bot never declared any to us), ``tools``
    (its ``tools/list``, verbatim), ``marks_refusals`` (that list said
    ``"brmcp/marksRefusals": true``) and ``updated`` (unix seconds of the
    last refresh), ``rtt`` (``(SRTT, RTTVAR)`` in seconds last measured to
    the bot, None when unknown). ``tools`` is always a :class:`ListedTools`
    whose ``marks_refusals`` is this one (a plain list is wrapped)."""

    bot: str
    era: Era
    protocol_version: str
    capabilities: ServerCapabilities | None = None
    tools: list[Tool] = field(default_factory=list)
    updated: int = 0
    marks_refusals: bool = False
    rtt: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self.tools = ListedTools(self.tools, marks_refusals=self.marks_refusals)

    def to_json(self) -> str:
        """The file content (compact JSON; tools as on the wire)."""
        data: dict[str, Any] = {
            "bot": self.bot,
            "era": self.era,
            "protocol_version": self.protocol_version,
            "capabilities": (
                None
                if self.capabilities is None
                else self.capabilities.model_dump(by_alias=True, mode="json", exclude_none=True)
            ),
            "tools": [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in self.tools],
            "marks_refusals": self.marks_refusals,
            "updated": self.updated,
        }
        if self.rtt is not None:
            data["rtt"] = {"srtt": self.rtt[0], "rttvar": self.rtt[1]}
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> BotSnapshot:
        """Decode a snapshot file. Raises ValueError for anything malformed."""
        try:
            data: Any = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        bot, era, version = data.get("bot"), data.get("era"), data.get("protocol_version")
        if not isinstance(bot, str) or era not in (ERA_MODERN, ERA_HANDSHAKE) or not isinstance(version, str):
            raise ValueError("bot, era or protocol_version missing or invalid")
        updated = data.get("updated", 0)
        if isinstance(updated, bool) or not isinstance(updated, int):
            raise ValueError("updated must be an integer")
        tools_raw = data.get("tools")
        if not isinstance(tools_raw, list):
            raise ValueError("tools must be a list")
        marks = data.get("marks_refusals", False)
        if not isinstance(marks, bool):
            raise ValueError("marks_refusals must be true or false")
        try:
            caps_raw = data.get("capabilities")
            capabilities = None if caps_raw is None else ServerCapabilities.model_validate(caps_raw)
            tools = [Tool.model_validate(t) for t in tools_raw]
        except pydantic.ValidationError as exc:
            raise ValueError(f"invalid tool or capabilities: {exc.error_count()} errors") from None
        return cls(
            bot=bot.lower(),
            era=era,
            protocol_version=version,
            capabilities=capabilities,
            tools=tools,
            updated=updated,
            marks_refusals=marks,
            rtt=_rtt(data.get("rtt")),
        )


class SnapshotStore:
    """The snapshot files under ``<data_dir>/mcpsnapshots``. Blocking file
    I/O: call from a worker thread."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / SNAPSHOT_DIR

    def path(self, uid: str) -> Path:
        return self.directory / f"{uid.lower()}.json"

    def load(self, uid: str) -> BotSnapshot | None:
        """The snapshot of ``uid``, or None when there is none or it cannot
        be used (logged at warning level; the bot is asked again). A file
        over :data:`MAX_SNAPSHOT_BYTES`, or not a regular file, is never
        read."""
        path = self.path(uid)
        try:
            text = _read_bounded(path, MAX_SNAPSHOT_BYTES)
            if text is None:
                return None
            snapshot = BotSnapshot.from_json(text)
            if snapshot.bot != uid.lower():
                raise ValueError(f"names bot {snapshot.bot[:16]}…, not this one")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            log.warning("ignoring bot snapshot %s: %s", path, exc)
            return None
        return snapshot

    def load_all(self) -> dict[str, BotSnapshot]:
        """Every usable snapshot, by lowercase bot uid (files that are not
        ``<64 hex>.json`` are ignored)."""
        found: dict[str, BotSnapshot] = {}
        try:
            names = sorted(p.name for p in self.directory.iterdir())
        except OSError:
            return found
        for name in names:
            uid = name[: -len(".json")] if name.endswith(".json") else ""
            if len(uid) != 64 or any(ch not in "0123456789abcdef" for ch in uid):
                continue
            snapshot = self.load(uid)
            if snapshot is not None:
                found[uid] = snapshot
        return found

    def save(self, snapshot: BotSnapshot) -> None:
        """Write ``snapshot`` atomically (mode 0600). Raises OSError, and
        :class:`SnapshotTooLarge` (a ValueError; nothing written, the file
        in place stays) when its JSON is over :data:`MAX_SNAPSHOT_BYTES`."""
        text = snapshot.to_json()
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        if size > MAX_SNAPSHOT_BYTES:
            raise SnapshotTooLarge(f"{size} bytes of JSON, over the {MAX_SNAPSHOT_BYTES}-byte bound")
        write_atomic(self.path(snapshot.bot), text)


def _rtt(raw: Any) -> tuple[float, float] | None:
    """``(srtt, rttvar)`` of a snapshot's ``rtt`` object, or None when it is
    absent or not two finite numbers >= 0 (only the first guess is lost)."""
    if not isinstance(raw, dict):
        return None
    srtt, rttvar = _seconds(raw.get("srtt")), _seconds(raw.get("rttvar"))
    if srtt is None or rttvar is None:
        return None
    return (srtt, rttvar)


def _seconds(value: Any) -> float | None:
    """A JSON number as finite seconds >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _read_bounded(path: Path, limit: int) -> str | None:
    """The UTF-8 content of ``path``, or None when it does not exist.
    Reads at most ``limit`` + 1 bytes: raises :class:`SnapshotTooLarge`
    when the file (as stat says, or as read) is larger than ``limit``,
    ValueError when it is not a regular file (opened without blocking, so a
    FIFO cannot stall the reader), OSError for other failures and
    UnicodeDecodeError for non-UTF-8 content."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > limit:
            raise SnapshotTooLarge(f"{info.st_size} bytes, over the {limit}-byte bound; not read")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise SnapshotTooLarge(f"over the {limit}-byte bound (it grew while read); not read further")
    return data.decode("utf-8")
