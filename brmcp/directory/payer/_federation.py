"""Federation: peer directories as customers, never as authorities
(docs/directory.md §Federation; karamble/brmcp, ``directory/federation.go``).

* ``verify_peer`` buys a curated peer's signed snapshot (out of the
  directory's pocket, at most :data:`PEER_SNAPSHOT_BUDGET_FACTOR` times its
  own snapshot price, judged against the peer's listed price), verifies it
  against the key stored by ``add_peer`` and turns unknown providers into
  leads. Nothing from a snapshot is listed; a snapshot signed by another
  key yields nothing. A peer that offers the index in pages (this
  directory's extension, docs/directory.md §Snapshot pages) is bought its
  manifest, at the same bound, and its pages fetched free; a Go peer
  sells ``get_snapshot``.
* ``pursue_lead`` calls the lead's ``listing_invite`` (a free tool: any
  payment request fails the invite). When the provider cannot be reached,
  it asks for a transitive key exchange through the peer that supplied the
  lead (an :class:`Introducer`) and retries the invite when
  :meth:`Federation.notify_kx` reports the exchange complete.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

import anyio.abc

from brmcp._ops.clock import Clock
from brmcp.protocol.listing import Listing

from ..db import LEAD_CONVERTED, LEAD_INVITED, LEAD_NEW, LEAD_PURSUING, DirectoryStore, Lead
from ..model import (
    InviteIn,
    InviteOut,
    PagesRefused,
    Policy,
    ShapeError,
    Snapshot,
    SnapshotMirror,
    verify_manifest,
    verify_snapshot,
)
from ._client import CallError, ProviderClient, listing_in, result_json, result_text
from ._pipeline import new_call_key

__all__ = [
    "MAX_PEER_PAGES",
    "PEER_SNAPSHOT_BUDGET_FACTOR",
    "Federation",
    "Introducer",
    "Suggester",
    "leads_from",
]

log = logging.getLogger("brmcp.directory")

#: What one snapshot purchase may cost, as a multiple of the directory's own
#: snapshot price (Go's ``peerSnapshotBudgetFactor``).
PEER_SNAPSHOT_BUDGET_FACTOR = 10
#: The most pages a peer's manifest may list (1 MiB pages: 256 MiB, about
#: 170k listings of the size bench/snapshot_bench.py measures).
MAX_PEER_PAGES = 256


_HEX = frozenset("0123456789abcdef")


def _text(value: Any) -> str | None:
    """``value`` when it is a string SQLite and JSON can carry (UTF-8
    encodable: no lone surrogates, which Python's JSON decoder lets
    through), else None."""
    if not isinstance(value, str):
        return None
    try:
        value.encode()
    except UnicodeEncodeError:
        return None
    return value


def leads_from(snapshot: Snapshot, *, me: str | None, peer_uid: str, now: int) -> list[Lead]:
    """The leads a verified ``snapshot`` of ``peer_uid`` suggests, in
    payload order: one per listing whose ``uid`` is a Bison Relay uid (64
    lowercase hex digits, as Go writes ``zkidentity.ShortID``) other than
    ``me`` and the peer, the first listing of a uid only. A
    ``description`` or tag that is not a string (or not valid UTF-8) is
    dropped; nothing else of the listing is kept. Go checks only the
    length (karamble/brmcp, ``directory/federation.go``), which lets
    ``"Z" * 64`` or the directory's own uid in capitals through."""
    leads: list[Lead] = []
    seen = {peer_uid, me or ""}
    for item in snapshot.listings:
        uid = item.get("uid")
        if not isinstance(uid, str) or len(uid) != 64 or not _HEX.issuperset(uid) or uid in seen:
            continue
        seen.add(uid)
        tags = item.get("tags")
        leads.append(
            Lead(
                provider_uid=uid,
                peer_uid=peer_uid,
                state=LEAD_NEW,
                created_at=now,
                updated_at=now,
                description=_text(item.get("description")) or "",
                tags=tuple(t for t in map(_text, tags) if t) if isinstance(tags, list) else (),
            )
        )
    return leads


class Introducer(Protocol):
    """Requests a transitive KX with ``target_uid`` through ``mediator_uid``
    (brclient's mediate-KX); completion arrives later through
    :meth:`Directory.notify_kx <brmcp.directory._service.Directory.notify_kx>`."""

    async def introduce(self, mediator_uid: str, target_uid: str) -> None: ...


class Suggester(Protocol):
    """Sends ``invitee_uid`` a KX suggestion toward ``target_uid`` (both
    KX'd with the directory); the invitee's client decides."""

    async def suggest(self, invitee_uid: str, target_uid: str) -> None: ...


class Federation:
    """Peers and leads of one directory."""

    def __init__(
        self,
        *,
        store: DirectoryStore,
        client: ProviderClient,
        policy: Policy,
        clock: Clock,
        introducer: Introducer | None,
        self_uid: Callable[[], str | None],
    ) -> None:
        self._store = store
        self._client = client
        self._policy = policy
        self._clock = clock
        self._introducer = introducer
        self._self_uid = self_uid
        self._tg: anyio.abc.TaskGroup | None = None

    def bind(self, tg: anyio.abc.TaskGroup | None) -> None:
        """Run invites after a key exchange in ``tg`` (None: not serving)."""
        self._tg = tg

    def _now(self) -> int:
        return int(self._clock.now())

    async def verify_peer(self, peer_uid: str) -> int:
        """Buy, verify and mine ``peer_uid``'s snapshot; returns the number
        of new leads. Raises ValueError for a peer not curated, a purchase
        or snapshot that fails (the message says which)."""
        peer = next((p for p in await self._store.peers() if p.uid == peer_uid), None)
        if peer is None:
            raise ValueError("not a curated peer; add_peer first")
        budget = self._policy.snapshot_price_atoms * PEER_SNAPSHOT_BUDGET_FACTOR
        try:
            catalog = await self._client.crawl(peer_uid)
            names = {tool.get("name") for tool in catalog if isinstance(tool, dict)}
            if {"get_snapshot_manifest", "get_snapshot_page"} <= names:
                snapshot = await self._paged_snapshot(peer_uid, peer.pub_key, json.dumps(catalog), budget)
                return await self._mine(peer_uid, snapshot)
            outcome = await self._client.paid_call(
                peer_uid,
                "get_snapshot",
                None,
                call_key=new_call_key(),
                cap=budget,
                listing=listing_in(json.dumps(catalog), "get_snapshot"),
                escrow_reg=None,
            )
        except CallError as exc:
            raise ValueError(f"snapshot purchase: {exc}") from None
        if outcome.result.is_error:
            raise ValueError(f"snapshot refused: {result_text(outcome.result)}")
        try:
            signed = json.loads(result_json(outcome.result))
        except ValueError as exc:
            raise ValueError(f"snapshot malformed: {exc}") from None
        return await self._mine(peer_uid, verify_snapshot(signed, peer.pub_key))

    async def _mine(self, peer_uid: str, snapshot: Snapshot) -> int:
        now = self._now()
        leads = leads_from(snapshot, me=self._self_uid(), peer_uid=peer_uid, now=now)
        added = await self._store.add_leads(leads)
        await self._store.stamp_peer(peer_uid, now)
        return added

    async def _paged_snapshot(self, peer_uid: str, pub_key: str, catalog: str, budget: int) -> Snapshot:
        """Buy the peer's manifest (at most ``budget``, judged against its
        listed price) and fetch its pages on one session, verified against
        ``pub_key`` (docs/directory.md §Snapshot pages). Raises
        :class:`CallError`, or ValueError for a refusal, a manifest of more
        than :data:`MAX_PEER_PAGES` pages or pages that do not verify."""
        async with self._client.session(peer_uid) as session:

            async def fetch(tool: str, args: dict[str, Any]) -> Any:
                outcome = await self._client.paid_call(
                    peer_uid,
                    tool,
                    args or None,
                    call_key=new_call_key(),
                    cap=budget if tool == "get_snapshot_manifest" else 0,
                    listing=listing_in(catalog, tool),
                    escrow_reg=None,
                    session=session,
                )
                if outcome.result.is_error:
                    raise PagesRefused(result_text(outcome.result))
                try:
                    return json.loads(result_json(outcome.result))
                except ValueError as exc:
                    raise ValueError(f"{tool} answer malformed: {exc}") from None

            mirror = SnapshotMirror(pub_key)
            try:
                signed = await fetch("get_snapshot_manifest", {})
                pages = len(verify_manifest(signed, pub_key).pages)
                if pages > MAX_PEER_PAGES:
                    raise ValueError(f"peer manifest lists {pages} pages, more than {MAX_PEER_PAGES}")
                mirror.load(signed, await mirror.pages_of(fetch, signed))
            except PagesRefused as exc:
                raise ValueError(f"snapshot refused: {exc}") from None
        return Snapshot(version=1, generated_at=mirror.generated_at, listings=mirror.snapshot())

    async def pursue_lead(self, uid: str) -> Lead:
        """Invite the lead ``uid`` to register: its state after (``invited``,
        or ``pursuing`` while a mediated key exchange is awaited). Raises
        ValueError for an unknown lead, or when the invite failed and no
        introduction could be requested."""
        lead = await self._store.lead(uid)
        if lead is None:
            raise ValueError("no lead for that uid")
        if lead.state == LEAD_CONVERTED:
            return lead
        try:
            await self.send_invite(uid)
        except (CallError, ValueError) as invite_error:
            if self._introducer is None:
                raise ValueError(f"invite failed and no introducer is configured: {invite_error}") from None
            try:
                await self._introducer.introduce(lead.peer_uid, uid)
            except Exception as exc:
                raise ValueError(f"invite failed ({invite_error}); introduction failed: {exc}") from None
            moved = await self._store.set_lead_state(
                uid, LEAD_PURSUING, "awaiting key exchange via peer", self._now()
            )
            return moved or lead
        moved = await self._store.set_lead_state(uid, LEAD_INVITED, "", self._now())
        return moved or lead

    async def send_invite(self, uid: str) -> None:
        """Call ``uid``'s ``listing_invite`` (free; never paid). A declined
        invite is noted on the lead. Raises :class:`CallError` or
        ValueError when the invite did not get an answer."""
        args = InviteIn(
            directory=self._policy.name, listing_fee_atoms=self._policy.listing_fee_atoms
        ).to_json()
        outcome = await self._client.paid_call(
            uid,
            "listing_invite",
            args,
            call_key=new_call_key(),
            cap=0,
            listing=Listing("free"),
            escrow_reg=None,
        )
        if outcome.result.is_error:
            raise ValueError(f"invite refused: {result_text(outcome.result)}")
        try:
            answer = InviteOut.from_json(json.loads(result_json(outcome.result)))
        except (ValueError, ShapeError) as exc:
            raise ValueError(f"invite reply malformed: {exc}") from None
        if not answer.accepted:
            await self._store.set_lead_state(uid, LEAD_INVITED, f"declined: {answer.note}", self._now())

    def notify_kx(self, uid: str) -> None:
        """A key exchange with ``uid`` completed: a lead pursuing it gets
        its invite now (a task of the directory)."""
        if self._tg is not None:
            self._tg.start_soon(self._after_kx, uid, name=f"brmcpdir-lead-{uid[:8]}")

    async def _after_kx(self, uid: str) -> None:
        lead = await self._store.lead(uid)
        if lead is None or lead.state != LEAD_PURSUING:
            return
        try:
            await self.send_invite(uid)
        except (CallError, ValueError) as exc:
            await self._store.set_lead_state(
                uid, LEAD_PURSUING, f"invite after KX failed: {exc}", self._now()
            )
            log.info("lead %s: invite after KX failed: %s", uid[:8], exc)
            return
        await self._store.set_lead_state(uid, LEAD_INVITED, "", self._now())
