"""A fake Bison Relay network for fake brclients, built on :class:`~brmcp.testing.Fabric`.

Users are uids on the fabric. PMs travel over the fabric as their plain text,
so the fabric's faults, size limit, statistics and offline store-and-forward
apply to them unchanged; the relay stamps each PM with its send time (the BR
server timestamp brclient reports as ``timestampMs``). Only KX'd contacts can
exchange PMs and tips (anything else is ``user <x> not found`` at the
sender). Tips are simulated: a tip from A to B emits tip-progress events at A
and, once B is online, a received tip at B.

Key exchanges: :meth:`FakeRelay.kx` makes contacts silently (test set-up:
no ``KXCompleted`` is logged, so existing logs stay as they were);
:meth:`FakeRelay.complete_kx` does it as a finished exchange, a
``KXCompleted`` event at both ends, as a real client logs one for every
exchange (brnet's start-up invites included). A mediated KX (``ChatService.MediateKX``
from A through M towards T, brclient's ``/mi``) is carried by the relay in
the background once A, M and T are all online: it completes (A and T become
contacts, both get ``KXCompleted`` with one shared initial rendezvous) when
M and T are contacts then, and is dropped otherwise, as a real mediator
that does not know the target only logs it (:class:`Mediation` records
each outcome). A KX suggestion (brclientd's ``SuggestKX`` from D to
invitee I about target T) reaches I once it is online, as a
:class:`KXSuggestion` on I's fake; accepting it is a mediated KX from I
through D.

PM pacing (a fake brclient's ``pm_pacing``) is modelled on the real network:
there the ``PM`` call returns once the relay has the PM, and the recipient
fetches the PMs of one sender one at a time, subscribing to the next
rendezvous point ≈ 0.1 s after each (bisonrelay batches its rendezvous
subscriptions with that delay). So a paced PM is accepted at once and waits
in the relay, in a queue per direction (from, to) that a task of the relay
drains: in order, the first PM after an idle spell at once, each later one
``pacing`` seconds after the one before. Directions are independent. The PMs
are the relay's: a sender that stops does not lose them; they are lost only
when the relay stops.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import anyio
import anyio.abc

from ..fabric import Fabric

__all__ = ["FakeRelay", "KXSuggestion", "Mediation", "RelayMember", "TipFailure"]

log = logging.getLogger("brmcp.testing.fakebr")


class RelayMember(Protocol):
    """What the relay needs of a fake brclient (:class:`~.server.FakeBRClient`
    has it; the relay does not import the server module)."""

    nick: str
    uid: str
    wallet: bool
    pm_pacing: float

    def _receive_pm(self, from_uid: str, text: str, timestamp_ms: int) -> None: ...

    def emit_received_tip(self, from_uid: str, amount_matoms: int) -> Any: ...

    def emit_tip_progress(
        self,
        to_uid: str,
        amount_matoms: int,
        *,
        nick: str | None = None,
        completed: bool = False,
        attempt: int = 0,
        attempt_err: str = "",
        will_retry: bool = False,
    ) -> Any: ...

    def emit_kx_completed(
        self, uid: str, *, nick: str | None = None, initial_rendezvous: bytes = b""
    ) -> Any: ...

    def _receive_kx_suggestion(self, suggestion: KXSuggestion) -> None: ...


@dataclass(frozen=True, slots=True)
class KXSuggestion:
    """A suggestion ``invitee`` received from ``suggester`` to key-exchange
    with ``target`` (uids, 64 lowercase hex; ``target_nick`` as the suggester
    knows it). Accepting it is a mediated KX through ``suggester``."""

    suggester: str
    invitee: str
    target: str
    target_nick: str


@dataclass(eq=False, slots=True)
class Mediation:
    """One mediated KX the relay carries: ``requester`` asked ``mediator``
    to introduce it to ``target`` (uids). ``outcome`` is ``""`` while it
    waits for all three to be online, then ``"completed"`` or the reason it
    was dropped; ``done`` is set then."""

    requester: str
    mediator: str
    target: str
    outcome: str = ""
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(frozen=True, slots=True)
class TipFailure:
    """Make the next tip's first ``attempts`` invoice attempts fail with
    ``error``. Each failure emits a tip-progress event with ``willRetry`` while
    attempts remain; when ``attempts >= maxAttempts`` the last one is terminal
    (``willRetry`` false) and nothing is paid. ``delay`` seconds pass before
    each attempt resolves."""

    attempts: int = 1
    error: str = "fake relay: invoice request timed out"
    delay: float = 0.0


class FakeRelay:
    """The fake relay. Use as ``async with FakeRelay() as relay:`` (it owns the
    tasks that carry tips; a fabric passed in must already be entered, one
    created here is entered and closed with the relay)."""

    def __init__(self, fabric: Fabric | None = None, *, seed: int | None = None) -> None:
        self._own_fabric = fabric is None
        # brclients check sizes themselves (after compression): the relay's
        # own fabric carries anything up to the v1 limit.
        self.fabric = fabric if fabric is not None else Fabric(seed=seed, max_pm_bytes=18 << 20)
        self.nicks: dict[str, str] = {}
        self._contacts: dict[str, dict[str, None]] = {}
        self._clients: dict[str, RelayMember] = {}
        self._pm_times: dict[tuple[str, str], deque[tuple[str, int]]] = {}
        # Paced PMs not yet handed to the fabric, per direction: (text, pacing, stamp entry).
        self._outbox: dict[tuple[str, str], deque[tuple[str, float, tuple[str, int]]]] = {}
        self._pacers: set[tuple[str, str]] = set()  # directions whose queue a task drains now
        self._last_pm: dict[tuple[str, str], float] = {}  # anyio time of each direction's last hand-off
        #: Paced PMs the fabric refused when the relay handed them on (an
        #: injected send failure, its size limit); each was logged and lost.
        self.pms_lost = 0
        self._tip_locks: dict[tuple[str, str], anyio.Lock] = {}
        self._online: anyio.Event | None = None
        self._tips_waiting = 0
        #: Every mediated KX asked for, oldest first (:class:`Mediation`).
        self.mediations: list[Mediation] = []
        #: Every KX suggestion sent, oldest first (delivered or still waiting).
        self.suggestions: list[KXSuggestion] = []
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> FakeRelay:
        if self._own_fabric:
            await self.fabric.__aenter__()
        self._online = anyio.Event()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        assert tg is not None
        tg.cancel_scope.cancel()
        try:
            # The body's exception propagates as itself, not inside an ExceptionGroup.
            await tg.__aexit__(None, None, None)
        finally:
            self._tg = None
            if self._own_fabric:
                await self.fabric.__aexit__(None, None, None)
        return None

    # -- users and contacts -----------------------------------------------------------

    def add_user(self, nick: str, uid: str | None = None) -> str:
        """Register a user (a uid on the fabric) and return its uid (random when
        not given; 64 lowercase hex)."""
        uid = (uid or os.urandom(32).hex()).lower()
        if len(uid) != 64 or any(c not in "0123456789abcdef" for c in uid):
            raise ValueError(f"uid {uid!r} is not 64 hex characters")
        if uid in self.nicks:
            raise ValueError(f"uid {uid} is already registered")
        self.nicks[uid] = nick
        self._contacts.setdefault(uid, {})
        return uid

    def kx(self, a: str | RelayMember, b: str | RelayMember) -> None:
        """Make two users mutual contacts (a completed key exchange)."""
        ua, ub = _uid_of(a), _uid_of(b)
        for uid in (ua, ub):
            if uid not in self.nicks:
                raise KeyError(f"unknown user {uid}")
        if ua == ub:
            raise ValueError("a user cannot KX with itself")
        self._contacts[ua][ub] = None
        self._contacts[ub][ua] = None

    def complete_kx(
        self, a: str | RelayMember, b: str | RelayMember, *, rendezvous: bytes | None = None
    ) -> None:
        """Make two users contacts as a finished key exchange: :meth:`kx`,
        then a ``KXCompleted`` event at each end that has a fake brclient,
        both with the same initial rendezvous (``rendezvous``, default 32
        random bytes)."""
        ua, ub = _uid_of(a), _uid_of(b)
        self.kx(ua, ub)
        rv = os.urandom(32) if rendezvous is None else rendezvous
        for here, there in ((ua, ub), (ub, ua)):
            member = self._clients.get(here)
            if member is not None:
                member.emit_kx_completed(there, initial_rendezvous=rv)

    def unkx(self, a: str | RelayMember, b: str | RelayMember) -> None:
        """Remove a contact pair (both directions)."""
        ua, ub = _uid_of(a), _uid_of(b)
        self._contacts.get(ua, {}).pop(ub, None)
        self._contacts.get(ub, {}).pop(ua, None)

    def kx_all(self, *users: str | RelayMember) -> None:
        """Make every pair of ``users`` contacts."""
        uids = [_uid_of(u) for u in users]
        for i, a in enumerate(uids):
            for b in uids[i + 1 :]:
                self.kx(a, b)

    def contacts(self, uid: str) -> list[str]:
        """``uid``'s contacts, in KX order."""
        return list(self._contacts.get(uid, {}))

    def are_contacts(self, a: str, b: str) -> bool:
        return b in self._contacts.get(a, {})

    def client(self, uid: str) -> RelayMember | None:
        """The fake brclient of ``uid``, if any."""
        return self._clients.get(uid)

    # -- mediated key exchanges and suggestions ---------------------------------------

    def start_mediate_kx(self, requester: str, mediator: str, target: str) -> Mediation:
        """Carry a mediated KX in the background (``MediateKX`` returns before
        it completes; the module text); returns its :class:`Mediation`.
        The caller checked that ``mediator`` is a contact of ``requester``."""
        tg = self._tg
        if tg is None:
            raise RuntimeError("FakeRelay must be entered ('async with relay')")
        mediation = Mediation(requester, mediator, target)
        self.mediations.append(mediation)
        tg.start_soon(self._run_mediation, mediation)
        return mediation

    async def _run_mediation(self, mediation: Mediation) -> None:
        uids = (mediation.requester, mediation.mediator, mediation.target)
        while any(self.is_offline(uid) for uid in uids):
            for uid in uids:
                await self.wait_online(uid)
        if not self.are_contacts(mediation.mediator, mediation.target):
            mediation.outcome = (
                f"mediator {mediation.mediator} has no contact {mediation.target}: the request is dropped"
            )
            log.info("fakebr relay: %s", mediation.outcome)
        elif self.are_contacts(mediation.requester, mediation.target):
            mediation.outcome = "already contacts"
        else:
            self.complete_kx(mediation.requester, mediation.target)
            mediation.outcome = "completed"
        mediation.done.set()

    def start_suggest_kx(self, suggester: str, invitee: str, target: str) -> KXSuggestion:
        """Send ``invitee`` a suggestion from ``suggester`` to KX with
        ``target`` (the caller checked both are ``suggester``'s contacts); it
        is delivered once ``invitee`` is online."""
        tg = self._tg
        if tg is None:
            raise RuntimeError("FakeRelay must be entered ('async with relay')")
        suggestion = KXSuggestion(suggester, invitee, target, self.nicks.get(target, ""))
        self.suggestions.append(suggestion)
        tg.start_soon(self._deliver_suggestion, suggestion)
        return suggestion

    async def _deliver_suggestion(self, suggestion: KXSuggestion) -> None:
        await self.wait_online(suggestion.invitee)
        member = self._clients.get(suggestion.invitee)
        if member is not None:
            member._receive_kx_suggestion(suggestion)

    # -- online state -----------------------------------------------------------------

    def set_offline(self, uid: str) -> None:
        """Take ``uid`` off the relay: PMs to it are stored, tips to it wait."""
        self.fabric.set_offline(uid)

    def set_online(self, uid: str) -> None:
        """Bring ``uid`` back: stored PMs are delivered, waiting tips complete."""
        self.fabric.set_online(uid)
        if self._online is not None:
            self._online.set()
            self._online = anyio.Event()

    def is_offline(self, uid: str) -> bool:
        return self.fabric.is_offline(uid)

    @property
    def tips_waiting(self) -> int:
        """Tips held until their payee is back on the relay (each has made its
        attempts and waits for the payee's invoice)."""
        return self._tips_waiting

    async def wait_online(self, uid: str) -> None:
        """Return once ``uid`` is on the relay."""
        while self.is_offline(uid):
            assert self._online is not None
            await self._online.wait()

    # -- traffic ------------------------------------------------------------------------

    def _register(self, client: RelayMember, uid: str | None) -> str:
        uid = self.add_user(client.nick, uid)
        self._clients[uid] = client

        def deliver(from_uid: str, text: str) -> None:
            client._receive_pm(from_uid, text, self._pop_time(from_uid, uid, text))

        self.fabric.attach(uid, deliver)
        self.fabric.set_offline(uid)  # a brclient that is not running yet
        return uid

    def _pop_time(self, from_uid: str, to_uid: str, text: str) -> int:
        queue = self._pm_times.get((from_uid, to_uid))
        if queue:
            for index, (sent, stamp) in enumerate(queue):
                if sent == text:
                    del queue[index]
                    return stamp
        return _relay_stamp()

    @property
    def pms_queued(self) -> int:
        """Paced PMs accepted and not yet handed to the fabric (every direction)."""
        return sum(len(queue) for queue in self._outbox.values())

    def _stamp(self, from_uid: str, to_uid: str, text: str) -> tuple[str, int]:
        """Record the relay's timestamp of a PM it takes now (delivery pops it)."""
        queue = self._pm_times.setdefault((from_uid, to_uid), deque())
        entry = (text, _relay_stamp())
        queue.append(entry)
        if len(queue) > 10_000:
            queue.popleft()
        return entry

    def _unstamp(self, from_uid: str, to_uid: str, entry: tuple[str, int]) -> None:
        queue = self._pm_times.get((from_uid, to_uid))
        if queue is not None and entry in queue:
            queue.remove(entry)

    async def send_pm(self, from_uid: str, to_uid: str, text: str, *, pacing: float = 0.0) -> None:
        """Hand a PM to the relay, stamped now (in whole seconds, as the BR
        server does).

        ``pacing`` <= 0: the PM goes to the fabric in this call, which raises
        the fabric's errors (``PMTooLargeError``, ``LinkDownError``).

        ``pacing`` > 0 (a real brclient's timing): the PM joins its
        direction's queue and the call returns at once; the relay hands it to
        the fabric in order, the first after an idle spell at once, each
        later one ``pacing`` seconds after the one before (the module text).
        What the fabric does then happens after the call has returned, as on
        the real network: a PM that its faults drop, or that it refuses (an
        injected send failure, its size limit), is lost; a refusal is logged
        and counted in :attr:`pms_lost`. Needs the relay entered."""
        entry = self._stamp(from_uid, to_uid, text)
        if pacing <= 0:
            try:
                await self.fabric.sender(from_uid).send_pm(to_uid, text)
            except BaseException:
                self._unstamp(from_uid, to_uid, entry)
                raise
            return
        tg = self._tg
        if tg is None:
            self._unstamp(from_uid, to_uid, entry)
            raise RuntimeError("FakeRelay must be entered ('async with relay')")
        key = (from_uid, to_uid)
        self._outbox.setdefault(key, deque()).append((text, pacing, entry))
        if key not in self._pacers:
            self._pacers.add(key)
            tg.start_soon(self._drain, key)

    async def _drain(self, key: tuple[str, str]) -> None:
        """Hand one direction's queued PMs to the fabric, paced; ends when the
        queue is empty (the next PM starts another drain)."""
        from_uid, to_uid = key
        queue = self._outbox[key]
        sender = self.fabric.sender(from_uid)
        try:
            while queue:
                text, pacing, entry = queue[0]
                last = self._last_pm.get(key)
                if last is not None:
                    wait = last + pacing - anyio.current_time()
                    if wait > 0:
                        await anyio.sleep(wait)
                queue.popleft()
                self._last_pm[key] = anyio.current_time()
                try:
                    await sender.send_pm(to_uid, text)
                except Exception as exc:  # the fabric refused it: lost, as a relay drop would be
                    self._unstamp(from_uid, to_uid, entry)
                    self.pms_lost += 1
                    log.warning("fakebr relay: PM from %s to %s lost: %s", from_uid[:8], to_uid[:8], exc)
        finally:
            self._pacers.discard(key)
            if not queue:
                self._outbox.pop(key, None)

    def start_tip(
        self,
        sender: RelayMember,
        to_uid: str,
        amount_matoms: int,
        max_attempts: int,
        failure: TipFailure | None,
    ) -> None:
        """Run a tip in the background (``TipUser`` returns before it completes)."""
        if self._tg is None:
            raise RuntimeError("FakeRelay must be entered ('async with relay')")
        self._tg.start_soon(self._run_tip, sender, to_uid, amount_matoms, max_attempts, failure)

    async def _run_tip(
        self,
        sender: RelayMember,
        to_uid: str,
        amount_matoms: int,
        max_attempts: int,
        failure: TipFailure | None,
    ) -> None:
        # Tips from one user to one payee run one at a time; an attempt that
        # cannot finish holds every later one (docs/clientrpc.md §Observed on a real network).
        lock = self._tip_locks.setdefault((sender.uid, to_uid), anyio.Lock())
        async with lock:
            await self._run_one_tip(sender, to_uid, amount_matoms, max_attempts, failure)

    async def _run_one_tip(
        self,
        sender: RelayMember,
        to_uid: str,
        amount_matoms: int,
        max_attempts: int,
        failure: TipFailure | None,
    ) -> None:
        nick = self.nicks.get(to_uid, "")
        failed = failure.attempts if failure is not None else 0
        attempt = 0
        while True:
            attempt += 1
            if failure is not None and failure.delay > 0:
                await anyio.sleep(failure.delay)
            if attempt > failed:
                break
            assert failure is not None
            will_retry = attempt < max_attempts
            sender.emit_tip_progress(
                to_uid,
                amount_matoms,
                nick=nick,
                attempt=attempt,
                attempt_err=failure.error,
                will_retry=will_retry,
            )
            if not will_retry:
                return
        self._tips_waiting += 1
        try:
            await self.wait_online(to_uid)
        finally:
            self._tips_waiting -= 1
        recipient = self._clients.get(to_uid)
        if recipient is None:
            sender.emit_tip_progress(
                to_uid,
                amount_matoms,
                nick=nick,
                attempt=attempt,
                attempt_err=f"fake relay: {to_uid} has no wallet to receive tips",
            )
            return
        if sender.pm_pacing > 0:
            await anyio.sleep(sender.pm_pacing)  # the invoice request and reply
        if not recipient.wallet:
            # brclient's stock no-wallet payment client: the payee's invoice is
            # for 0 milliatoms and reports a 0-matoms tip at once; the tipper's
            # attempt fails and would be retried after 24 h, holding later tips.
            recipient.emit_received_tip(sender.uid, 0)
            sender.emit_tip_progress(
                to_uid,
                amount_matoms,
                nick=nick,
                attempt=attempt,
                attempt_err=(
                    f"milliatoms requested in invoice (0) different than milliatoms originally "
                    f"requested ({amount_matoms})"
                ),
                will_retry=True,
            )
            await anyio.sleep_forever()
        recipient.emit_received_tip(sender.uid, amount_matoms)
        sender.emit_tip_progress(to_uid, amount_matoms, nick=nick, attempt=attempt, completed=True)


def _relay_stamp() -> int:
    """The BR server's timestamp: whole seconds, in milliseconds."""
    return int(time.time()) * 1000


def _uid_of(user: str | RelayMember) -> str:
    return user if isinstance(user, str) else user.uid
