"""What a directory answers, read as a stranger's claim (BRIDGE.md §Finding
bots through directories; the answers' shapes: docs/directory.md §Tools).

Each answer is bounded: :data:`MAX_ANSWER_BYTES` of JSON,
:data:`MAX_HITS_PER_DIRECTORY` hits, strings cut to :data:`MAX_TEXT_CHARS`
with the characters that do not print dropped; a hit without a 64-hex
provider uid or a tool name is dropped. The records here (:class:`Claim`,
:class:`Hit`, :class:`DirectoryAnswer`, :class:`FindResult`,
:class:`Introduction`) are what the admin surface answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mcp.types import CallToolResult, TextContent

from brmcp.bridge.base import is_uid

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_HITS_PER_DIRECTORY",
    "MAX_QUERY_CHARS",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "MAX_TEXT_CHARS",
    "Claim",
    "DirectoryAnswer",
    "FindResult",
    "Hit",
    "Introduction",
    "answer_object",
    "cap_hint",
    "cut_text",
    "error_text",
    "parse_claim",
    "provider_claims",
    "refusal_reason",
    "unix_time",
]


#: Largest directory answer read (JSON bytes of its structured content, or
#: of its text when it has none); a larger one is refused as a whole.
MAX_ANSWER_BYTES = 1024 * 1024
#: Most hits kept from one directory (docs/directory.md: a directory returns
#: at most 50); the rest are dropped and counted in ``dropped``.
MAX_HITS_PER_DIRECTORY = 50
#: Longest text kept of a tool name, a description or a note (characters).
MAX_TEXT_CHARS = 300
#: Longest query (characters) and most tags of a find request, and the
#: longest tag (the directory's own bounds, docs/directory.md ``register``).
MAX_QUERY_CHARS = 256
MAX_TAGS = 16
MAX_TAG_CHARS = 32
_REFUSAL_MARK = "payment not made: "


@dataclass(frozen=True, slots=True)
class Claim:
    """What one directory says about one tool of one provider: the listed
    price (``price_atoms``, None when not given; ``pricing`` ``"dynamic"``
    when priced per call), the description and tags, and the Unix times of
    its last crawl (``catalog_checked_at``) and last paid test call
    (``last_verified_execution``), None when absent or not a time."""

    directory: str
    description: str = ""
    price_atoms: int | None = None
    pricing: str = ""
    tags: tuple[str, ...] = ()
    catalog_checked_at: int | None = None
    last_verified_execution: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "description": self.description,
            "priceAtoms": self.price_atoms,
            "pricing": self.pricing,
            "tags": list(self.tags),
            "catalogCheckedAt": self.catalog_checked_at,
            "lastVerifiedExecution": self.last_verified_execution,
        }


@dataclass(slots=True)
class Hit:
    """One tool of one provider (``provider``: 64 lowercase hex) and what
    each directory that listed it said (``claims``, in the order of
    ``directories``)."""

    provider: str
    tool: str
    claims: list[Claim] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"providerUid": self.provider, "tool": self.tool, "claims": [c.to_dict() for c in self.claims]}


@dataclass(frozen=True, slots=True)
class DirectoryAnswer:
    """How one directory answered a find: ``outcome`` ``"ok"``,
    ``"refused"`` (the bridge did not pay for the search: ``error`` is the
    reason, naming the cap), ``"unreachable"`` (no answer, no key exchange,
    or brclient down), ``"timeout"`` or ``"failed"`` (an error answer, or
    one over the bounds); ``hits`` kept, ``dropped`` (malformed or over
    :data:`MAX_HITS_PER_DIRECTORY`) and the ``total`` the directory
    claimed (None when absent)."""

    directory: str
    outcome: str
    error: str = ""
    hits: int = 0
    dropped: int = 0
    total: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"directory": self.directory, "outcome": self.outcome}
        if self.error:
            out["error"] = self.error
        out |= {"hits": self.hits, "dropped": self.dropped, "total": self.total}
        return out


@dataclass(frozen=True, slots=True)
class FindResult:
    """A find: the merged ``hits`` (one per provider and tool, first-seen
    order), one :class:`DirectoryAnswer` per configured directory, and
    ``now``, the bridge clock's Unix time, against which freshness is told."""

    hits: list[Hit]
    directories: list[DirectoryAnswer]
    now: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "hits": [h.to_dict() for h in self.hits],
            "directories": [d.to_dict() for d in self.directories],
            "now": self.now,
        }


@dataclass(frozen=True, slots=True)
class Introduction:
    """A directory (``via``) sent this bridge's brclient a KX suggestion
    toward ``provider``; ``note`` is its text (cut, control characters
    dropped)."""

    provider: str
    via: str
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.provider, "via": self.via, "suggested": True, "note": self.note}


def cut_text(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """A stranger's string for a terminal or a page: non-strings empty,
    characters that do not print dropped, cut at ``limit``."""
    if not isinstance(value, str):
        return ""
    kept = "".join(ch for ch in value if ch.isprintable())
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


def unix_time(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value >= 1 << 40:
        return None
    return value


def parse_claim(directory: str, raw: Any) -> tuple[str, str, Claim] | None:
    """One hit of a directory's answer, or None when it is malformed."""
    if not isinstance(raw, dict):
        return None
    provider, tool = raw.get("providerUid"), cut_text(raw.get("tool"), 128)
    if not isinstance(provider, str) or not is_uid(provider) or not tool:
        return None
    price = raw.get("priceAtoms")
    tags = raw.get("tags")
    claim = Claim(
        directory=directory,
        description=cut_text(raw.get("description")),
        price_atoms=price if isinstance(price, int) and not isinstance(price, bool) and price >= 0 else None,
        pricing=cut_text(raw.get("pricing"), 16),
        tags=tuple(cut_text(t, MAX_TAG_CHARS) for t in tags[:MAX_TAGS] if cut_text(t, MAX_TAG_CHARS))
        if isinstance(tags, list)
        else (),
        catalog_checked_at=unix_time(raw.get("catalogCheckedAt")),
        last_verified_execution=unix_time(raw.get("lastVerifiedExecution")),
    )
    return provider.lower(), tool, claim


def answer_object(result: CallToolResult) -> Any:
    """The JSON object a directory answered (its structured content, else
    its first text item parsed). Raises ValueError over the bounds or for
    text that is not JSON."""
    if result.structured_content is not None:
        raw = json.dumps(result.structured_content)
        if len(raw.encode("utf-8")) > MAX_ANSWER_BYTES:
            raise ValueError(f"answer over {MAX_ANSWER_BYTES} bytes")
        return result.structured_content
    for block in result.content:
        if isinstance(block, TextContent):
            if len(block.text.encode("utf-8")) > MAX_ANSWER_BYTES:
                raise ValueError(f"answer over {MAX_ANSWER_BYTES} bytes")
            return json.loads(block.text)
    raise ValueError("answer has no JSON")


def error_text(result: CallToolResult) -> str:
    texts = [b.text for b in result.content if isinstance(b, TextContent)]
    return cut_text(" ".join(texts) or "error without text")


def refusal_reason(result: CallToolResult) -> str | None:
    """The bridge's own reason for not paying (its refusal note), if any."""
    for block in result.content:
        if isinstance(block, TextContent) and _REFUSAL_MARK in block.text:
            return cut_text(block.text.split(_REFUSAL_MARK, 1)[1])
    return None


def cap_hint(reason: str, command: str) -> str:
    """What to run to change the cap a refusal names (nothing otherwise)."""
    if "per-call cap" in reason:
        return f"; raise it with: {command} settings set per_call_cap_atoms=N"
    if "daily cap" in reason:
        return f"; raise it with: {command} settings set per_day_cap_atoms=N"
    return ""


def provider_claims(raw: dict[str, Any]) -> dict[str, Any]:
    """A directory's ``get_provider`` answer bounded like a find hit: the
    description cut at :data:`MAX_TEXT_CHARS`, at most :data:`MAX_TAGS`
    tags, at most :data:`MAX_HITS_PER_DIRECTORY` catalog tools (``name``,
    ``description``, ``priceAtoms`` and ``pricing`` from their ``_meta``;
    ``catalogDropped`` counts the rest and the malformed), times that are
    not Unix seconds as None."""
    tags = raw.get("tags")
    catalog = raw.get("catalog")
    tools: list[dict[str, Any]] = []
    entries = catalog if isinstance(catalog, list) else []
    for entry in entries:
        if len(tools) >= MAX_HITS_PER_DIRECTORY:
            break
        if not isinstance(entry, dict) or not cut_text(entry.get("name"), 128):
            continue
        meta = entry.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        price = meta.get("brmcp/priceAtoms")
        tools.append(
            {
                "name": cut_text(entry.get("name"), 128),
                "description": cut_text(entry.get("description")),
                "priceAtoms": price
                if isinstance(price, int) and not isinstance(price, bool) and 0 <= price < 1 << 63
                else None,
                "pricing": cut_text(meta.get("brmcp/pricing"), 16),
            }
        )
    latency = raw.get("testLatencyMs")
    return {
        "description": cut_text(raw.get("description")),
        "tags": [cut_text(t, MAX_TAG_CHARS) for t in tags[:MAX_TAGS] if cut_text(t, MAX_TAG_CHARS)]
        if isinstance(tags, list)
        else [],
        "catalog": tools,
        "catalogDropped": len(entries) - len(tools),
        "catalogCheckedAt": unix_time(raw.get("catalogCheckedAt")),
        "lastVerifiedExecution": unix_time(raw.get("lastVerifiedExecution")),
        "testLatencyMs": latency
        if isinstance(latency, int) and not isinstance(latency, bool) and 0 <= latency < 1 << 40
        else None,
        "approvedAt": unix_time(raw.get("approvedAt")),
        "renewedAt": unix_time(raw.get("renewedAt")),
        "expiresAt": unix_time(raw.get("expiresAt")),
    }
