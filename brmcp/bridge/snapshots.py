"""Per-bot snapshots that survive restarts: the bot's tool list, the MCP
era it speaks and the capabilities it declared (BRIDGE.md §Eras and snapshots).

One file per bot, ``<data_dir>/mcpsnapshots/<uid>.json``, written
atomically with mode 0600 (the directory 0700)::

    {"bot": "<64 hex>", "era": "modern", "protocol_version": "2026-07-28",
     "capabilities": {...} | null, "tools": [...], "updated": 1800000000}

``era`` is ``"modern"`` (2026-07-28: no initialize, an envelope per
request) or ``"handshake"`` (initialize first: the Go reference and older
SDKs). A missing, unreadable or malformed file is no snapshot: the bridge
asks the bot again (it never fails to start because of one).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic
from mcp.types import ServerCapabilities, Tool

from ._files import read_text, write_atomic

__all__ = ["ERA_HANDSHAKE", "ERA_MODERN", "SNAPSHOT_DIR", "BotSnapshot", "Era", "SnapshotStore"]

log = logging.getLogger("brmcp.bridge")

#: Directory (inside the bridge's data directory) holding one file per bot.
SNAPSHOT_DIR = "mcpsnapshots"
#: The bot answers 2026-07-28 requests: no initialize, an envelope per request.
ERA_MODERN: Literal["modern"] = "modern"
#: The bot needs the initialize handshake first.
ERA_HANDSHAKE: Literal["handshake"] = "handshake"
Era = Literal["modern", "handshake"]
#: Largest snapshot file read back (bytes); a larger one is ignored.
MAX_SNAPSHOT_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class BotSnapshot:
    """What the bridge remembers of one bot: ``bot`` (lowercase uid),
    ``era``, ``protocol_version`` (the version last used with it),
    ``capabilities`` (None when the bot never declared any to us), ``tools``
    (its ``tools/list``, verbatim) and ``updated`` (unix seconds of the
    last refresh)."""

    bot: str
    era: Era
    protocol_version: str
    capabilities: ServerCapabilities | None = None
    tools: list[Tool] = field(default_factory=list)
    updated: int = 0

    def to_json(self) -> str:
        """The file content (compact JSON; tools as on the wire)."""
        return json.dumps(
            {
                "bot": self.bot,
                "era": self.era,
                "protocol_version": self.protocol_version,
                "capabilities": (
                    None
                    if self.capabilities is None
                    else self.capabilities.model_dump(by_alias=True, mode="json", exclude_none=True)
                ),
                "tools": [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in self.tools],
                "updated": self.updated,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )

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
        be used (logged at warning level; the bot is asked again)."""
        path = self.path(uid)
        try:
            if path.exists() and path.stat().st_size > MAX_SNAPSHOT_BYTES:
                raise ValueError(f"larger than {MAX_SNAPSHOT_BYTES} bytes")
            text = read_text(path)
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
        """Write ``snapshot`` atomically (mode 0600). Raises OSError."""
        write_atomic(self.path(snapshot.bot), snapshot.to_json())
