"""Finding bots through directories (BRIDGE.md §Finding bots through
directories; the directory's tools: docs/directory.md §Tools).

A directory is a brmcp bot whose ``search`` lists tools of providers it
verified, and whose ``introduce`` sends the caller a key-exchange (KX)
suggestion toward one of them. The user names directories in the setting
``directories``; this module asks them on the user's behalf, for the
``brmcp-bridge find`` and ``add`` commands (through the admin surface,
``/admin/find``, ``/admin/contact/<uid>``, ``/admin/introduce`` and
``/admin/wait-kx``).

Every request to a directory is an ordinary logical call through the
bridge's bot path (:meth:`~.proxy.BotProxy.call`): the caps, approval mode and
the hard bound apply to a priced ``search`` exactly as to any tool, so a
directory cannot make the bridge pay more than the listing the bridge was
shown and the caps allow. What a directory answers is a stranger's claim:

* each answer is bounded (:data:`MAX_ANSWER_BYTES`, :data:`MAX_HITS_PER_DIRECTORY`
  hits, strings cut to :data:`MAX_TEXT_CHARS`), a hit without a 64-hex
  provider uid or a tool name is dropped, and each directory is given
  :data:`FIND_TIMEOUT` s of wall time (plus ``approval_timeout_secs`` in
  approval mode), after which its call is cancelled (a payment parked for
  it is withdrawn; one already made stays within the listing and the caps);
* nothing a directory says changes the settings: a provider is reached only
  after the user runs ``brmcp-bridge add`` (or ``settings set
  allowed_bots=…``), which only the admin token can do. Agents reach the
  directories at ``/mcp/<directory uid>`` like any allowed bot, and cannot
  widen ``allowed_bots`` or the caps; an agent's ``request_bot``
  (:mod:`.agentdiscovery`) adds one uid only once the user approves it
  (:mod:`.botrequests`).

Whether a key exchange exists is asked of brclient (:class:`Contacts`; the
daemon's is :class:`ClientrpcContacts`: ``ChatService.UserNick`` answers
``user <uid> not found`` for anyone who is not a contact, and
``ChatService.KXStream`` reports each completed exchange). A bridge hosted
without such a source answers ``contact: null`` and refuses to wait for an
exchange it cannot see.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from brmcp.bridge.base import Settings, is_uid
from brmcp.clientrpc import ClientrpcError, KXCompleted, RPCError

__all__ = [
    "FIND_TIMEOUT",
    "INTRODUCE_TIMEOUT",
    "KX_TIMEOUT",
    "MAX_ANSWER_BYTES",
    "MAX_HITS_PER_DIRECTORY",
    "MAX_KX_TIMEOUT",
    "MAX_QUERY_CHARS",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "MAX_TEXT_CHARS",
    "Claim",
    "ClientrpcContacts",
    "Contacts",
    "ContactsUnavailable",
    "DirectoryAnswer",
    "Discovery",
    "DiscoveryError",
    "FindResult",
    "Hit",
    "Introduction",
]

log = logging.getLogger("brmcp.bridge.find._discovery")

#: Wall seconds one directory's ``search`` may take (approval mode adds
#: ``approval_timeout_secs``); then its call is cancelled.
FIND_TIMEOUT = 60.0
#: Wall seconds one directory's ``introduce`` may take.
INTRODUCE_TIMEOUT = 60.0
#: Default wall seconds ``wait-kx`` waits for a completed key exchange.
KX_TIMEOUT = 300.0
#: Longest wait for a key exchange a request may ask for.
MAX_KX_TIMEOUT = 3600.0
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


class DiscoveryError(Exception):
    """A refused discovery request: ``status`` is the HTTP status the admin
    surface answers (400 bad input, 409 nothing configured, 502 directory
    failures, 503 brclient cannot tell, 504 a wait ran out); the message is
    one line for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ContactsUnavailable(Exception):
    """brclient cannot tell now whether a user is a contact (not connected,
    or an unexpected answer)."""


class Contacts(Protocol):
    """Whether this brclient has a key exchange with a user."""

    async def is_contact(self, uid: str) -> bool:
        """True when ``uid`` (64 lowercase hex) is a contact. Raises
        :class:`ContactsUnavailable` when brclient cannot tell now."""
        ...

    async def wait_kx(self, uid: str, wait_secs: float) -> bool:
        """Wait up to ``wait_secs`` wall seconds until ``uid`` is a contact;
        True at once when it already is, False when the time ran out.
        Raises :class:`ContactsUnavailable`."""
        ...


class _KXClient(Protocol):
    @property
    def connected(self) -> bool: ...

    async def call(self, method: str, params: Mapping[str, Any]) -> Any: ...

    def kx_stream(self, unacked_from: int = 0) -> AsyncIterator[KXCompleted]: ...


class ClientrpcContacts:
    """:class:`Contacts` over a :class:`~brmcp.clientrpc.Client` (the daemon's
    brclient connection): ``ChatService.UserNick`` tells a contact (brclient
    answers ``user <uid> not found`` for anyone else), ``ChatService.KXStream``
    each exchange that completes. The stream is opened only while a wait runs
    and its events are not acked: the kx log stays as brclient keeps it."""

    def __init__(self, client: _KXClient) -> None:
        self._client = client

    async def is_contact(self, uid: str) -> bool:
        # Imported here: the approvals page's nick look-up is the same call.
        from brmcp.clientrpc.nicks import clientrpc_user_nick

        try:
            await clientrpc_user_nick(self._client, uid.lower())
        except RPCError as exc:
            if "not found" in str(exc):
                return False
            raise ContactsUnavailable(f"brclient's UserNick failed: {exc}") from None
        except ClientrpcError as exc:
            raise ContactsUnavailable(f"brclient cannot tell: {exc or type(exc).__name__}") from None
        return True

    async def wait_kx(self, uid: str, wait_secs: float) -> bool:
        wanted = uid.lower()
        events = self._client.kx_stream()
        try:
            with anyio.move_on_after(wait_secs):
                # Opened before the check: an exchange completing in between
                # is in the stream (brclient replays its unacked log).
                if await self.is_contact(wanted):
                    return True
                async for event in events:
                    if event.uid.lower() == wanted:
                        return True
            return False
        finally:
            close = getattr(events, "close", None)
            if callable(close):
                close()


class _Proxy(Protocol):
    async def call(self, tool: str, arguments: dict[str, Any] | None) -> CallToolResult: ...


class DiscoveryHost(Protocol):
    """What discovery needs from the bridge (the :class:`~brmcp.bridge.Bridge`)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def cli_command(self) -> str: ...

    def clock_now(self) -> float: ...

    def _proxy(self, uid: str) -> Any: ...


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


def _text(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """A stranger's string for a terminal or a page: non-strings empty,
    characters that do not print dropped, cut at ``limit``."""
    if not isinstance(value, str):
        return ""
    kept = "".join(ch for ch in value if ch.isprintable())
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


def _time(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value >= 1 << 40:
        return None
    return value


def _claim(directory: str, raw: Any) -> tuple[str, str, Claim] | None:
    """One hit of a directory's answer, or None when it is malformed."""
    if not isinstance(raw, dict):
        return None
    provider, tool = raw.get("providerUid"), _text(raw.get("tool"), 128)
    if not isinstance(provider, str) or not is_uid(provider) or not tool:
        return None
    price = raw.get("priceAtoms")
    tags = raw.get("tags")
    claim = Claim(
        directory=directory,
        description=_text(raw.get("description")),
        price_atoms=price if isinstance(price, int) and not isinstance(price, bool) and price >= 0 else None,
        pricing=_text(raw.get("pricing"), 16),
        tags=tuple(_text(t, MAX_TAG_CHARS) for t in tags[:MAX_TAGS] if _text(t, MAX_TAG_CHARS))
        if isinstance(tags, list)
        else (),
        catalog_checked_at=_time(raw.get("catalogCheckedAt")),
        last_verified_execution=_time(raw.get("lastVerifiedExecution")),
    )
    return provider.lower(), tool, claim


def _answer_object(result: CallToolResult) -> Any:
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


def _error_text(result: CallToolResult) -> str:
    texts = [b.text for b in result.content if isinstance(b, TextContent)]
    return _text(" ".join(texts) or "error without text")


def _refusal(result: CallToolResult) -> str | None:
    """The bridge's own reason for not paying (its refusal note), if any."""
    for block in result.content:
        if isinstance(block, TextContent) and _REFUSAL_MARK in block.text:
            return _text(block.text.split(_REFUSAL_MARK, 1)[1])
    return None


def _cap_hint(reason: str, command: str) -> str:
    """What to run to change the cap a refusal names (nothing otherwise)."""
    if "per-call cap" in reason:
        return f"; raise it with: {command} settings set per_call_cap_atoms=N"
    if "daily cap" in reason:
        return f"; raise it with: {command} settings set per_day_cap_atoms=N"
    return ""


class Discovery:
    """Find, introduce and KX waits for one bridge (``host``) with an optional
    brclient ``contacts`` source. ``find_timeout``, ``introduce_timeout``:
    wall seconds per directory (module constants by default)."""

    def __init__(
        self,
        host: DiscoveryHost,
        *,
        contacts: Contacts | None = None,
        find_timeout: float = FIND_TIMEOUT,
        introduce_timeout: float = INTRODUCE_TIMEOUT,
    ) -> None:
        self._host = host
        self.contacts = contacts
        self.find_timeout = find_timeout
        self.introduce_timeout = introduce_timeout

    @property
    def host(self) -> DiscoveryHost:
        """The bridge this discovery asks through (its settings and bot path)."""
        return self._host

    def directories(self) -> tuple[str, ...]:
        """The configured directories (lowercase uids). Raises
        :class:`DiscoveryError` (409, naming the settings command) when none is."""
        return self._directories()

    def _directories(self) -> tuple[str, ...]:
        directories = tuple(d.lower() for d in self._host.settings.directories or ())
        if not directories:
            raise DiscoveryError(
                409,
                "no directories configured; add one with: "
                f"{self._host.cli_command} settings set directories=<directory uid>",
            )
        return directories

    def _not_contact(self, uid: str, what: str) -> str:
        return (
            f"{what} {uid} is not a contact of your brclient (no key exchange yet): KX with it first "
            "(accept the invite its operator gives you in brclient)"
        )

    async def contact(self, uid: str) -> bool | None:
        """Whether ``uid`` is a contact of this bridge's brclient; None when
        no contacts source is set. Raises :class:`ContactsUnavailable`."""
        if self.contacts is None:
            return None
        return await self.contacts.is_contact(uid.lower())

    async def find(self, query: str, *, tags: tuple[str, ...] = (), max_price_atoms: int = 0) -> FindResult:
        """Ask every configured directory's ``search`` at once (``query``,
        ``tags``, ``max_price_atoms`` > 0: the directory drops tools listed
        above it) and merge the hits. Never raises for one directory's
        failure: its :class:`DirectoryAnswer` says it. Raises
        :class:`DiscoveryError` (409) when no directory is configured."""
        directories = self._directories()
        args: dict[str, Any] = {"query": query}
        if tags:
            args["tags"] = list(tags)
        if max_price_atoms > 0:
            args["maxPriceAtoms"] = max_price_atoms
        settings = self._host.settings
        timeout = self.find_timeout + (0 if settings.autopay else settings.approval_timeout_secs)
        answers: dict[str, tuple[DirectoryAnswer, list[tuple[str, str, Claim]]]] = {}

        async def ask(directory: str) -> None:
            answers[directory] = await self._search(directory, args, timeout)

        async with anyio.create_task_group() as tg:
            for directory in directories:
                tg.start_soon(ask, directory)
        merged: dict[tuple[str, str], Hit] = {}
        for directory in directories:
            for provider, tool, claim in answers[directory][1]:
                hit = merged.setdefault((provider, tool), Hit(provider, tool))
                hit.claims.append(claim)
        return FindResult(
            hits=list(merged.values()),
            directories=[answers[d][0] for d in directories],
            now=int(self._host.clock_now()),
        )

    async def _search(
        self, directory: str, args: dict[str, Any], limit: float
    ) -> tuple[DirectoryAnswer, list[tuple[str, str, Claim]]]:
        command = self._host.cli_command
        try:
            if await self.contact(directory) is False:
                return DirectoryAnswer(
                    directory, "unreachable", self._not_contact(directory, "directory")
                ), []
        except ContactsUnavailable as exc:
            return DirectoryAnswer(directory, "unreachable", f"directory {directory}: {exc}"), []
        result: CallToolResult | None = None
        try:
            with anyio.move_on_after(limit):
                result = await self._host._proxy(directory).call("search", args)
        except MCPError as exc:
            return DirectoryAnswer(directory, "unreachable", f"directory {directory}: {_text(str(exc))}"), []
        except Exception as exc:
            # One directory's failure must not end the others' answers.
            log.exception("search at directory %s failed", directory)
            why = _text(str(exc) or type(exc).__name__)
            return DirectoryAnswer(directory, "failed", f"directory {directory}: {why}"), []
        if result is None:
            return (
                DirectoryAnswer(
                    directory,
                    "timeout",
                    f"directory {directory} did not answer search within {limit:.0f} s; the call was "
                    f"cancelled (a payment made for it, within your caps, is in: {command} spend)",
                ),
                [],
            )
        if result.is_error:
            reason = _refusal(result)
            if reason is not None:
                error = f"search at directory {directory} refused: {reason}{_cap_hint(reason, command)}"
                return DirectoryAnswer(directory, "refused", error), []
            return DirectoryAnswer(directory, "failed", f"directory {directory}: {_error_text(result)}"), []
        try:
            answer = _answer_object(result)
        except ValueError as exc:
            return DirectoryAnswer(directory, "failed", f"directory {directory}: {_text(str(exc))}"), []
        raw_hits = answer.get("hits") if isinstance(answer, dict) else None
        if not isinstance(raw_hits, list):
            return DirectoryAnswer(directory, "failed", f"directory {directory}: answer has no hits list"), []
        total = answer.get("total")
        kept: list[tuple[str, str, Claim]] = []
        seen: set[tuple[str, str]] = set()
        for raw in raw_hits:
            if len(kept) >= MAX_HITS_PER_DIRECTORY:
                break
            parsed = _claim(directory, raw)
            if parsed is None or parsed[:2] in seen:
                continue
            seen.add(parsed[:2])
            kept.append(parsed)
        return (
            DirectoryAnswer(
                directory,
                "ok",
                hits=len(kept),
                dropped=len(raw_hits) - len(kept),
                total=total if isinstance(total, int) and not isinstance(total, bool) else None,
            ),
            kept,
        )

    async def introduce(self, provider: str, via: str | None = None) -> Introduction:
        """Ask a directory's ``introduce`` (free: docs/directory.md) to send
        this brclient a KX suggestion toward ``provider``: ``via`` (one of
        ``directories``), else each configured directory in turn until one
        does. Raises :class:`DiscoveryError`: 400 for a malformed uid or a
        ``via`` that is not configured, 409 for none configured, 502 when
        no directory introduced (every reason given)."""
        provider = provider.lower()
        directories = self._directories()
        if via is not None:
            if not is_uid(via):
                raise DiscoveryError(400, f"via: {via!r} is not a 64-hex directory uid")
            if via.lower() not in directories:
                raise DiscoveryError(
                    400,
                    f"via: {via.lower()} is not on directories ({', '.join(directories)}); add it with: "
                    f"{self._host.cli_command} settings set directories=<the uids now>,{via.lower()}",
                )
            directories = (via.lower(),)
        reasons: list[str] = []
        for directory in directories:
            if directory == provider:
                continue
            try:
                if await self.contact(directory) is False:
                    reasons.append(self._not_contact(directory, "directory"))
                    continue
            except ContactsUnavailable as exc:
                raise DiscoveryError(503, str(exc)) from None
            result: CallToolResult | None = None
            try:
                with anyio.move_on_after(self.introduce_timeout):
                    result = await self._host._proxy(directory).call("introduce", {"uid": provider})
            except MCPError as exc:
                reasons.append(f"directory {directory}: {_text(str(exc))}")
                continue
            if result is None:
                reasons.append(f"directory {directory} did not answer within {self.introduce_timeout:.0f} s")
                continue
            if result.is_error:
                reasons.append(f"directory {directory}: {_error_text(result)}")
                continue
            try:
                answer = _answer_object(result)
            except ValueError as exc:
                reasons.append(f"directory {directory}: {_text(str(exc))}")
                continue
            if not isinstance(answer, dict) or answer.get("suggested") is not True:
                reasons.append(f"directory {directory} did not say it sent a suggestion")
                continue
            return Introduction(provider, directory, _text(answer.get("note")))
        raise DiscoveryError(502, f"no directory introduced you to {provider}: " + "; ".join(reasons))

    async def wait_kx(self, uid: str, wait_secs: float) -> bool:
        """Wait up to ``wait_secs`` wall seconds for a key exchange with
        ``uid``. Raises :class:`DiscoveryError` 503 without a contacts
        source or when brclient cannot tell."""
        if self.contacts is None:
            raise DiscoveryError(
                503, "this bridge has no brclient contact source, so it cannot see a key exchange complete"
            )
        try:
            return await self.contacts.wait_kx(uid.lower(), wait_secs)
        except ContactsUnavailable as exc:
            raise DiscoveryError(503, str(exc)) from None

    async def provider_details(self, uid: str) -> dict[str, Any]:
        """Ask every configured directory's ``get_provider`` for ``uid`` at
        once (each within :attr:`find_timeout` wall seconds, plus
        ``approval_timeout_secs`` in approval mode, through the bot path like
        :meth:`find`). Answers ``{"uid", "directories": [{"directory",
        "outcome", "error"?, "claims"}…], "now"}``: ``outcome`` as in
        :class:`DirectoryAnswer`; ``claims`` (None unless ``"ok"``) what that
        directory says, bounded like a find (:func:`_provider_claims`). Raises
        :class:`DiscoveryError` (409) when no directory is configured."""
        uid = uid.lower()
        directories = self._directories()
        settings = self._host.settings
        timeout = self.find_timeout + (0 if settings.autopay else settings.approval_timeout_secs)
        answers: dict[str, dict[str, Any]] = {}

        async def ask(directory: str) -> None:
            answers[directory] = await self._provider(directory, uid, timeout)

        async with anyio.create_task_group() as tg:
            for directory in directories:
                tg.start_soon(ask, directory)
        return {
            "uid": uid,
            "directories": [answers[d] for d in directories],
            "now": int(self._host.clock_now()),
        }

    async def _provider(self, directory: str, uid: str, limit: float) -> dict[str, Any]:
        def failed(outcome: str, error: str) -> dict[str, Any]:
            return {"directory": directory, "outcome": outcome, "error": error, "claims": None}

        try:
            if await self.contact(directory) is False:
                return failed("unreachable", self._not_contact(directory, "directory"))
        except ContactsUnavailable as exc:
            return failed("unreachable", f"directory {directory}: {exc}")
        result: CallToolResult | None = None
        try:
            with anyio.move_on_after(limit):
                result = await self._host._proxy(directory).call("get_provider", {"uid": uid})
        except MCPError as exc:
            return failed("unreachable", f"directory {directory}: {_text(str(exc))}")
        except Exception as exc:
            log.exception("get_provider at directory %s failed", directory)
            return failed("failed", f"directory {directory}: {_text(str(exc) or type(exc).__name__)}")
        if result is None:
            return failed(
                "timeout", f"directory {directory} did not answer get_provider within {limit:.0f} s"
            )
        if result.is_error:
            reason = _refusal(result)
            if reason is not None:
                return failed("refused", f"get_provider at directory {directory} refused: {reason}")
            return failed("failed", f"directory {directory}: {_error_text(result)}")
        try:
            answer = _answer_object(result)
        except ValueError as exc:
            return failed("failed", f"directory {directory}: {_text(str(exc))}")
        if not isinstance(answer, dict):
            return failed("failed", f"directory {directory}: answer is not an object")
        return {"directory": directory, "outcome": "ok", "claims": _provider_claims(answer)}


def _provider_claims(raw: dict[str, Any]) -> dict[str, Any]:
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
        if not isinstance(entry, dict) or not _text(entry.get("name"), 128):
            continue
        meta = entry.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        price = meta.get("brmcp/priceAtoms")
        tools.append(
            {
                "name": _text(entry.get("name"), 128),
                "description": _text(entry.get("description")),
                "priceAtoms": price
                if isinstance(price, int) and not isinstance(price, bool) and 0 <= price < 1 << 63
                else None,
                "pricing": _text(meta.get("brmcp/pricing"), 16),
            }
        )
    latency = raw.get("testLatencyMs")
    return {
        "description": _text(raw.get("description")),
        "tags": [_text(t, MAX_TAG_CHARS) for t in tags[:MAX_TAGS] if _text(t, MAX_TAG_CHARS)]
        if isinstance(tags, list)
        else [],
        "catalog": tools,
        "catalogDropped": len(entries) - len(tools),
        "catalogCheckedAt": _time(raw.get("catalogCheckedAt")),
        "lastVerifiedExecution": _time(raw.get("lastVerifiedExecution")),
        "testLatencyMs": latency
        if isinstance(latency, int) and not isinstance(latency, bool) and 0 <= latency < 1 << 40
        else None,
        "approvedAt": _time(raw.get("approvedAt")),
        "renewedAt": _time(raw.get("renewedAt")),
        "expiresAt": _time(raw.get("expiresAt")),
    }


# -- the admin routes ------------------------------------------------------------
