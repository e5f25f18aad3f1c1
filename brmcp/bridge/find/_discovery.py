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

* each answer is bounded (:mod:`._answers`: ``MAX_ANSWER_BYTES``, ``MAX_HITS_PER_DIRECTORY``
  hits, strings cut to ``MAX_TEXT_CHARS``), a hit without a 64-hex
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

Whether a key exchange exists is asked of brclient (:class:`~._contacts.Contacts`;
the daemon's is :class:`~._contacts.ClientrpcContacts`: ``ChatService.UserNick`` answers
``user <uid> not found`` for anyone who is not a contact, and
``ChatService.KXStream`` reports each completed exchange). A bridge hosted
without such a source answers ``contact: null`` and refuses to wait for an
exchange it cannot see.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from brmcp.bridge.base import Settings, is_uid

from ._answers import (
    MAX_HITS_PER_DIRECTORY,
    Claim,
    DirectoryAnswer,
    FindResult,
    Hit,
    Introduction,
    answer_object,
    cap_hint,
    cut_text,
    error_text,
    parse_claim,
    provider_claims,
    refusal_reason,
)
from ._contacts import Contacts, ContactsUnavailable

__all__ = [
    "FIND_TIMEOUT",
    "INTRODUCE_TIMEOUT",
    "KX_TIMEOUT",
    "MAX_KX_TIMEOUT",
    "Discovery",
    "DiscoveryError",
    "DiscoveryHost",
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


class DiscoveryError(Exception):
    """A refused discovery request: ``status`` is the HTTP status the admin
    surface answers (400 bad input, 409 nothing configured, 502 directory
    failures, 503 brclient cannot tell, 504 a wait ran out); the message is
    one line for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
            return DirectoryAnswer(
                directory, "unreachable", f"directory {directory}: {cut_text(str(exc))}"
            ), []
        except Exception as exc:
            # One directory's failure must not end the others' answers.
            log.exception("search at directory %s failed", directory)
            why = cut_text(str(exc) or type(exc).__name__)
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
            reason = refusal_reason(result)
            if reason is not None:
                error = f"search at directory {directory} refused: {reason}{cap_hint(reason, command)}"
                return DirectoryAnswer(directory, "refused", error), []
            return DirectoryAnswer(directory, "failed", f"directory {directory}: {error_text(result)}"), []
        try:
            answer = answer_object(result)
        except ValueError as exc:
            return DirectoryAnswer(directory, "failed", f"directory {directory}: {cut_text(str(exc))}"), []
        raw_hits = answer.get("hits") if isinstance(answer, dict) else None
        if not isinstance(raw_hits, list):
            return DirectoryAnswer(directory, "failed", f"directory {directory}: answer has no hits list"), []
        total = answer.get("total")
        kept: list[tuple[str, str, Claim]] = []
        seen: set[tuple[str, str]] = set()
        for raw in raw_hits:
            if len(kept) >= MAX_HITS_PER_DIRECTORY:
                break
            parsed = parse_claim(directory, raw)
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
                reasons.append(f"directory {directory}: {cut_text(str(exc))}")
                continue
            if result is None:
                reasons.append(f"directory {directory} did not answer within {self.introduce_timeout:.0f} s")
                continue
            if result.is_error:
                reasons.append(f"directory {directory}: {error_text(result)}")
                continue
            try:
                answer = answer_object(result)
            except ValueError as exc:
                reasons.append(f"directory {directory}: {cut_text(str(exc))}")
                continue
            if not isinstance(answer, dict) or answer.get("suggested") is not True:
                reasons.append(f"directory {directory} did not say it sent a suggestion")
                continue
            return Introduction(provider, directory, cut_text(answer.get("note")))
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
        directory says, bounded like a find (:func:`provider_claims`). Raises
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
            return failed("unreachable", f"directory {directory}: {cut_text(str(exc))}")
        except Exception as exc:
            log.exception("get_provider at directory %s failed", directory)
            return failed("failed", f"directory {directory}: {cut_text(str(exc) or type(exc).__name__)}")
        if result is None:
            return failed(
                "timeout", f"directory {directory} did not answer get_provider within {limit:.0f} s"
            )
        if result.is_error:
            reason = refusal_reason(result)
            if reason is not None:
                return failed("refused", f"get_provider at directory {directory} refused: {reason}")
            return failed("failed", f"directory {directory}: {error_text(result)}")
        try:
            answer = answer_object(result)
        except ValueError as exc:
            return failed("failed", f"directory {directory}: {cut_text(str(exc))}")
        if not isinstance(answer, dict):
            return failed("failed", f"directory {directory}: answer is not an object")
        return {"directory": directory, "outcome": "ok", "claims": provider_claims(answer)}
