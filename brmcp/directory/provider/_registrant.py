"""The provider side of a directory: the :class:`Registrant` registers the
host bot at directories, funds the listing under an :class:`AutoFund`
policy and serves the free ``listing_invite`` tool that directories invite
providers with (docs/directory.md, "The provider side"; karamble/brmcp,
``directory/registrant.go``).

A directory is a stranger to the provider: its answers may be false,
inconsistent, endless or never come. So every call to it is bounded in
time, its invoice is checked against what this provider asked for, and no
payment exceeds the shortfall the directory named or the policy's caps.
The payments are recorded in ``<data_dir>/regfund.json`` (a JSON array of
``{"ts": unix seconds, "directoryUid": uid, "atoms": n}``, the Go
reference's file) before the money moves, so a crash between the record
and the payment can only over-count against the monthly cap.

After registering, :meth:`Registrant.follow` watches the registration
until it settles (listed, rejected, gone, or parked with a failure): at a
directory that announces the push-status resource (docs/directory.md §Push
status: the ``resources.subscribe`` capability and the resource listed, or the
``brmcp/statusResource`` hint) it subscribes to it and reads it on each
update, with a safety read every :data:`SAFETY_POLL_SECS`; at any other (the
Go reference) it polls ``my_status``, every :data:`POLL_INTERVAL_SECS` at
first, doubling up to :data:`SAFETY_POLL_SECS`.

Amounts are atoms (int); times are unix seconds on the injected clock.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
from mcp import ClientSession
from mcp.client.session import IncomingMessage

from brmcp._ops.clock import Clock, SystemClock
from brmcp.server import CallContext, Harness
from brmcp.transport.router import Router

from ..model import (
    STATE_AWAITING_FUNDING,
    STATE_CRAWLING,
    STATE_LISTED,
    STATE_PENDING_REVIEW,
    STATE_TESTING,
    STATUS_URI,
    InviteIn,
    InviteOut,
    ShapeError,
    StatusOut,
    settled,
    status_from_read,
)
from ._fundhistory import FUND_FILE, FundEntry, FundHistory
from ._line import DirectoryLine, brief, printable
from ._regconfig import AutoFund, RegistrantConfig, RegistrantError, RegistrationError
from ._tippay import Payer

__all__ = [
    "CALL_TIMEOUT_SECS",
    "FUND_FILE",
    "FUND_WINDOW_SECS",
    "INVITE_SCHEMA",
    "MAX_FOLLOW_FAILURES",
    "MAX_REGISTRATIONS_IN_FLIGHT",
    "PAY_TIMEOUT_SECS",
    "POLL_INTERVAL_SECS",
    "RENEW_AHEAD_SECS",
    "SAFETY_POLL_SECS",
    "AutoFund",
    "FundEntry",
    "FundHistory",
    "Notify",
    "Registrant",
    "RegistrantConfig",
    "RegistrantError",
    "RegistrationError",
]

log = logging.getLogger("brmcp.directory.provider._registrant")

#: How close to its expiry a listing is renewed by :meth:`Registrant.register`;
#: a listing further from expiry is left alone (renewing is paid), so a host
#: may register on every start for free (karamble/brmcp, ``directory/registrant.go``).
RENEW_AHEAD_SECS = 7 * 24 * 3600
#: The rolling window ``max_atoms_per_month`` counts over.
FUND_WINDOW_SECS = 30 * 24 * 3600
#: Longest wait for one step with a directory (opening the session, one tool
#: call), as the Go reference's dial timeout.
CALL_TIMEOUT_SECS = 120.0
#: Longest wait for a funding payment's outcome (the Go reference's).
PAY_TIMEOUT_SECS = 180.0
#: Most registrations accepted invites may run at once (one per directory).
MAX_REGISTRATIONS_IN_FLIGHT = 8
#: Seconds between safety reads of a subscribed status resource (an update
#: lost on the way is noticed this late); also the longest ``my_status`` poll
#: interval, and the wait before a failed follow session is opened again.
SAFETY_POLL_SECS = 300.0
#: The first ``my_status`` poll interval at a directory without push status;
#: each poll doubles it up to :data:`SAFETY_POLL_SECS`.
POLL_INTERVAL_SECS = 30.0
#: Follow sessions failing in a row (none reading a status) before
#: :meth:`Registrant.follow` gives up.
MAX_FOLLOW_FAILURES = 12

_UID = re.compile(r"[0-9a-f]{64}")
_INT64_MAX = (1 << 63) - 1

#: ``notify(directory_uid, status, error)``: every registration outcome and
#: every declined invite; ``status`` is the directory's last answer (None when
#: there was none), ``error`` the reason it failed (None on success). May be
#: a plain function or a coroutine function; its exceptions are logged.
Notify = Callable[[str, StatusOut | None, Exception | None], Awaitable[None] | None]


INVITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "directory": {"type": "string", "description": "the inviting directory's name (informational)"},
        "listingFeeAtoms": {"type": "integer", "description": "the directory's listing fee, in atoms"},
        "note": {"type": "string"},
    },
    # As the Go reference's schema (inferred from its InviteIn): the fields
    # without omitempty are required, and nothing else is accepted.
    "required": ["directory", "listingFeeAtoms"],
    "additionalProperties": False,
}
_INVITE_DESCRIPTION = (
    "Invite this provider to register at the calling directory. The operator's auto-fund policy "
    "decides; the registration itself happens asynchronously."
)


class Registrant:
    """The provider's directory client (docs/directory.md, "The provider
    side"; karamble/brmcp, ``directory/registrant.go``).

    ``config``: what to register as and where; ``payer``: pays funding tips
    to a directory; ``data_dir``: holds :data:`FUND_FILE`; ``router``: the
    host bot's router that sessions to directories are dialed on (or given
    to :meth:`run`); ``clock``: unix time and the timeouts
    (:data:`CALL_TIMEOUT_SECS`, :data:`PAY_TIMEOUT_SECS`, overridable by
    ``call_timeout`` and ``pay_timeout``); ``notify``: gets every outcome
    (default: one log line); ``name``: the MCP client name shown to
    directories; ``poll_interval`` and ``safety_poll``: the follow's
    intervals in seconds (:data:`POLL_INTERVAL_SECS`,
    :data:`SAFETY_POLL_SECS`).

    Use: :meth:`register_tools` on the host's harness (``listing_invite``),
    then ``await tg.start(registrant.run)`` once the router exists: it
    registers at every ``register_at_uids`` directory and runs the
    registrations accepted invites start, each a task of its own group;
    each registration is followed (:meth:`follow`) until it settles.
    """

    def __init__(
        self,
        config: RegistrantConfig,
        *,
        payer: Payer,
        data_dir: str | os.PathLike[str],
        router: Router | None = None,
        clock: Clock | None = None,
        notify: Notify | None = None,
        name: str = "registrant",
        call_timeout: float = CALL_TIMEOUT_SECS,
        pay_timeout: float = PAY_TIMEOUT_SECS,
        poll_interval: float = POLL_INTERVAL_SECS,
        safety_poll: float = SAFETY_POLL_SECS,
    ) -> None:
        if not poll_interval > 0 or not safety_poll > 0:
            raise ValueError("poll_interval and safety_poll must be > 0 seconds")
        self.config = config
        self.history = FundHistory(Path(data_dir) / FUND_FILE)
        self._payer = payer
        self._router = router
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._notify_cb = notify
        self._line = DirectoryLine(
            types.Implementation(name=name or "registrant", version="0.1.0"), self._clock, call_timeout
        )
        self._pay_timeout = pay_timeout
        self._fund_lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None
        self._in_flight: set[str] = set()
        self._poll_interval = poll_interval
        self._safety_poll = safety_poll
        #: Atoms handed to the payer so far (its calls returned or not).
        self.paid_atoms = 0

    # -- the policy ----------------------------------------------------------------

    def refusal(self, directory_uid: str, atoms: int) -> str | None:
        """Why the :class:`AutoFund` policy refuses paying ``atoms`` atoms
        to ``directory_uid`` now, or None when it allows it (the fund
        history must be loaded: :meth:`FundHistory.load`)."""
        policy = self.config.auto_fund
        if not policy.enabled:
            return "auto-funding is disabled"
        if policy.allowed_directory_uids and directory_uid not in policy.allowed_directory_uids:
            return "directory not in allowed_directory_uids"
        if atoms <= 0:
            return f"{atoms} atoms is not a payment"
        if atoms > policy.max_atoms_per_request:
            return f"{atoms} atoms exceeds the {policy.max_atoms_per_request} per-request cap"
        since = int(self._clock.now()) - FUND_WINDOW_SECS
        spent = self.history.total_since(since)
        if spent + atoms > policy.max_atoms_per_month:
            return f"{atoms} atoms would exceed the {policy.max_atoms_per_month} monthly cap ({spent} spent)"
        return None

    # -- listing_invite ------------------------------------------------------------

    def register_tools(self, harness: Harness) -> None:
        """Add the free ``listing_invite`` tool to ``harness``. In:
        ``{directory, listingFeeAtoms, note}``; out: ``{accepted, note}``.
        The inviting directory is the caller's uid, never the payload's
        ``directory`` (a name for people). Accepted when the policy allows
        ``listingFeeAtoms`` plus this provider's test budget from that
        directory, the Registrant is running and fewer than
        :data:`MAX_REGISTRATIONS_IN_FLIGHT` registrations run; the
        registration then starts in the background and the answer is
        immediate. Raises ValueError when the harness has that tool."""
        harness.add_tool(
            "listing_invite",
            self._invite,
            description=_INVITE_DESCRIPTION,
            input_schema=INVITE_SCHEMA,
            price_atoms=0,
        )

    async def _invite(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        directory = ctx.peer.lower()
        try:
            invite = InviteIn.from_json(args)
        except ShapeError as exc:
            return InviteOut(accepted=False, note=str(exc)).to_json()
        reason: str | None
        if invite.listing_fee_atoms < 0:
            reason = "listingFeeAtoms must be >= 0"
        else:
            try:
                await self.history.load()
            except RegistrantError as exc:
                log.error("listing invite from %s not considered: %s", directory, exc)
                return InviteOut(accepted=False, note="the provider's fund history is unreadable").to_json()
            reason = self.refusal(directory, invite.listing_fee_atoms + self.config.test.max_atoms)
        if reason is None:
            if self._tg is None or self._router is None:
                reason = "the registrant is not running"
            elif directory in self._in_flight:
                return InviteOut(accepted=True, note="a registration is already in progress").to_json()
            elif len(self._in_flight) >= MAX_REGISTRATIONS_IN_FLIGHT:
                reason = "too many registrations in progress; invite again later"
        if reason is not None:
            await self._notify(directory, StatusOut(note=f"invite declined: {reason}"), None)
            return InviteOut(accepted=False, note=reason).to_json()
        assert self._tg is not None
        self._in_flight.add(directory)
        self._tg.start_soon(self._background, directory, name=f"brmcp-registrant-{directory[:8]}")
        return InviteOut(accepted=True).to_json()

    # -- running -------------------------------------------------------------------

    async def run(
        self,
        router: Router | None = None,
        *,
        task_status: anyio.abc.TaskStatus[Registrant] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run until cancelled: load the fund history, start registering at
        every ``register_at_uids`` directory (in the background), report
        started (the Registrant), then own the registrations accepted
        invites start. ``router`` replaces the constructor's. Raises
        :class:`RegistrantError` before starting when the fund history is
        unreadable, RuntimeError when there is no router."""
        if router is not None:
            self._router = router
        if self._router is None:
            raise RuntimeError("Registrant.run needs the host's router")
        await self.history.load()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                for uid in self.config.register_at_uids:
                    if uid not in self._in_flight:
                        self._in_flight.add(uid)
                        tg.start_soon(self._background, uid, name=f"brmcp-registrant-{uid[:8]}")
                task_status.started(self)
                await anyio.sleep_forever()
            finally:
                self._tg = None

    async def _background(self, directory_uid: str) -> None:
        try:
            status = await self.register(directory_uid)
            if not settled(status):
                await self.follow(directory_uid, status)
        except RegistrationError:
            pass  # reported through notify
        finally:
            self._in_flight.discard(directory_uid)
            self._line.announced.discard(directory_uid)

    async def register(self, directory_uid: str) -> StatusOut:
        """Register at ``directory_uid`` and return its status afterwards.

        Reads ``my_status`` first and leaves a listing alone when it is
        ``listed`` with ``expiresAt`` more than :data:`RENEW_AHEAD_SECS` away;
        otherwise calls ``register`` with this provider's description, tags
        and test. A shortfall is paid, once, when the invoice is consistent
        (``awaiting_funding``, ``0 < shortfallAtoms <= requiredAtoms =
        feeAtoms + testBudgetAtoms``, ``testBudgetAtoms`` at most this
        provider's ``test.maxAtoms``) and :meth:`refusal` allows exactly that
        shortfall; the payment is recorded in the fund history first. A
        final ``my_status`` is returned (verification continues at the
        directory). Every outcome goes to ``notify``. Raises ValueError for
        a uid that is not 64 hex, RuntimeError without a router,
        :class:`RegistrationError` otherwise (unreachable or silent
        directory, a tool error, an answer that is not a status, a funding
        refusal, a failed payment)."""
        uid = directory_uid.lower()
        if _UID.fullmatch(uid) is None:
            raise ValueError(f"directory uid {directory_uid[:80]!r} is not 64 hex characters")
        if self._router is None:
            raise RuntimeError("Registrant.register needs the host's router (run the registrant first)")
        try:
            status = await self._register(self._router, uid)
        except RegistrationError as exc:
            await self._notify(uid, exc.status, exc)
            raise
        await self._notify(uid, status, None)
        return status

    async def _register(self, router: Router, uid: str) -> StatusOut:
        try:
            await self.history.load()
        except RegistrantError as exc:
            raise RegistrationError(str(exc)) from None
        return await self._line.session(router, uid, partial(self._steps, uid=uid))

    async def _steps(self, session: ClientSession, *, uid: str) -> StatusOut:
        try:
            current: StatusOut | None = await self._line.call(session, "my_status", {}, directory=uid)
        except RegistrationError:
            current = None  # not known there yet, or an old directory: register anyway
        if (
            current is not None
            and current.state == STATE_LISTED
            and current.expires_at > int(self._clock.now()) + RENEW_AHEAD_SECS
        ):
            return current
        if current is not None and (
            current.state in (STATE_CRAWLING, STATE_TESTING)
            or (current.state == STATE_PENDING_REVIEW and not current.note)
        ):
            # An application under way, or verified and awaiting review: a
            # Go directory would replace it and invoice the fee again.
            return current
        status = await self._line.call(
            session, "register", self.config.registration().to_json(), directory=uid
        )
        if status.shortfall_atoms <= 0:
            return status
        atoms = self._invoice(status)
        async with self._fund_lock:
            reason = self.refusal(uid, atoms)
            if reason is not None:
                raise RegistrationError(f"funding declined: {reason}", status)
            try:
                await self.history.record(
                    FundEntry(ts=int(self._clock.now()), directory_uid=uid, atoms=atoms)
                )
            except OSError as exc:
                raise RegistrationError(
                    f"funding not paid: the fund history cannot be written: {exc}", status
                ) from None
        self.paid_atoms += atoms
        try:
            await self._line.within(self._pay_timeout, self._payer.pay(uid, atoms))
        except TimeoutError:
            raise RegistrationError(
                f"funding payment of {atoms} atoms: no outcome after {self._pay_timeout:g} s "
                "(counted against the monthly cap)",
                status,
            ) from None
        except Exception as exc:
            raise RegistrationError(f"funding payment of {atoms} atoms: {brief(exc)}", status) from None
        log.info("paid %d atoms to directory %s for the listing", atoms, uid)
        try:
            return await self._line.call(session, "my_status", {})
        except RegistrationError as exc:
            raise RegistrationError(f"paid {atoms} atoms, then {exc}", status) from None

    def _invoice(self, status: StatusOut) -> int:
        """The shortfall to pay, or RegistrationError when the invoice does
        not add up against what this provider asked for."""
        test_max = self.config.test.max_atoms
        if status.state != STATE_AWAITING_FUNDING:
            problem = f"a shortfall in state {status.state[:40]!r}"
        elif status.test_budget_atoms > test_max:
            problem = f"testBudgetAtoms {status.test_budget_atoms} above the {test_max} asked for"
        elif status.fee_atoms < 0 or status.test_budget_atoms < 0:
            problem = "a negative fee or test budget"
        elif status.required_atoms != status.fee_atoms + status.test_budget_atoms:
            problem = f"requiredAtoms {status.required_atoms} is not feeAtoms + testBudgetAtoms"
        elif status.shortfall_atoms > status.required_atoms:
            problem = f"shortfallAtoms {status.shortfall_atoms} above requiredAtoms {status.required_atoms}"
        else:
            return status.shortfall_atoms
        raise RegistrationError(
            f"funding declined: the directory's invoice is inconsistent: {problem}", status
        )

    # -- following a registration ----------------------------------------------------

    async def follow(self, directory_uid: str, status: StatusOut | None = None) -> StatusOut:
        """Watch the registration at ``directory_uid`` until it settles
        (:func:`~.statuspush.settled`) and return that status; ``status``
        is the last one already reported. Every status that differs from
        the last reported goes to ``notify``.

        Push when the directory announces it (module docstring): subscribe
        to ``brmcpdir://registration``, read it now, on every
        ``notifications/resources/updated`` for it and every
        :data:`SAFETY_POLL_SECS`; otherwise poll ``my_status``. A session
        that fails is opened again after :data:`SAFETY_POLL_SECS`; after
        :data:`MAX_FOLLOW_FAILURES` failures in a row it raises
        :class:`RegistrationError` (also reported). Raises ValueError for a
        uid that is not 64 hex, RuntimeError without a router."""
        uid = directory_uid.lower()
        if _UID.fullmatch(uid) is None:
            raise ValueError(f"directory uid {directory_uid[:80]!r} is not 64 hex characters")
        if self._router is None:
            raise RuntimeError("Registrant.follow needs the host's router (run the registrant first)")
        watch = _Watch(status)
        failures = 0
        try:
            while True:
                reads = watch.reads
                try:
                    return await self._line.session(
                        self._router, uid, partial(self._watch, uid=uid, watch=watch), on_message=watch.heard
                    )
                except RegistrationError as exc:
                    failures = 1 if watch.reads > reads else failures + 1
                    if failures >= MAX_FOLLOW_FAILURES:
                        error = RegistrationError(f"stopped following the registration: {exc}", watch.last)
                        await self._notify(uid, watch.last, error)
                        raise error from None
                    log.info(
                        "directory %s: following the registration: %s; again in %g s",
                        uid,
                        exc,
                        self._safety_poll,
                    )
                await self._clock.sleep(self._safety_poll)
        finally:
            self._line.announced.discard(uid)

    async def _watch(self, session: ClientSession, *, uid: str, watch: _Watch) -> StatusOut:
        push = await self._subscribe(session, uid)
        interval = self._safety_poll if push else self._poll_interval
        # Subscribed: read at once (a change before the subscription is not
        # missed). Polling: the status just reported is a first poll.
        delay = 0.0 if push or watch.last is None else interval
        while True:
            if delay > 0:
                try:
                    await self._line.within(delay, watch.wake.wait())
                except TimeoutError:
                    pass
                if not push:
                    interval = min(interval * 2, self._safety_poll)
            watch.wake = anyio.Event()  # before the read: an update during it is not lost
            if push:
                status = await self._read_status(session)
            else:
                status = await self._line.call(session, "my_status", {})
            watch.reads += 1
            if status != watch.last:
                watch.last = status
                await self._notify(uid, status, None)
            if settled(status):
                return status
            delay = interval

    async def _subscribe(self, session: ClientSession, uid: str) -> bool:
        """Subscribe to the status resource when the directory announces it
        (the ``resources.subscribe`` capability, and the hint or the resource
        listed); whether it did. A directory that refuses is polled."""
        init = session.initialize_result
        resources = init.capabilities.resources if init is not None else None
        if resources is None or not resources.subscribe:
            return False
        try:
            if uid not in self._line.announced:
                listed = await self._line.within(self._line.call_timeout, session.list_resources())
                if not any(str(item.uri) == STATUS_URI for item in listed.resources):
                    return False
            request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=STATUS_URI))
            await self._line.within(self._line.call_timeout, session.send_request(request, types.EmptyResult))
        except TimeoutError:
            raise RegistrationError(
                f"resources/subscribe: the directory did not answer within {self._line.call_timeout:g} s"
            ) from None
        except Exception as exc:
            log.info("directory %s: no push status (%s); polling my_status", uid, brief(exc))
            return False
        return True

    async def _read_status(self, session: ClientSession) -> StatusOut:
        try:
            result = await self._line.within(self._line.call_timeout, session.read_resource(STATUS_URI))
        except TimeoutError:
            raise RegistrationError(
                f"{STATUS_URI}: the directory did not answer within {self._line.call_timeout:g} s"
            ) from None
        except Exception as exc:
            raise RegistrationError(f"{STATUS_URI}: {brief(exc)}") from None
        try:
            return status_from_read(result)
        except ValueError as exc:
            raise RegistrationError(f"{STATUS_URI}: {brief(exc)}") from None

    # -- talking to a directory ------------------------------------------------------

    async def _notify(self, uid: str, status: StatusOut | None, error: Exception | None) -> None:
        if self._notify_cb is None:
            _log_outcome(uid, status, error)
            return
        try:
            value = self._notify_cb(uid, status, error)
            if inspect.isawaitable(value):
                await value
        except Exception:
            log.exception("directory %s: the notify callback failed", uid)


class _Watch:
    """One follow's state: the last status reported, the reads made, and
    the event an update notification of the status resource sets."""

    __slots__ = ("last", "reads", "wake")

    def __init__(self, last: StatusOut | None) -> None:
        self.last = last
        self.reads = 0
        self.wake = anyio.Event()

    async def heard(self, message: IncomingMessage) -> None:
        """The session's ``message_handler``: wakes the follow on an update
        of the status resource, ignores everything else."""
        if isinstance(message, types.ResourceUpdatedNotification) and message.params.uri == STATUS_URI:
            self.wake.set()


def _log_outcome(uid: str, status: StatusOut | None, error: Exception | None) -> None:
    """The default notify: one line (WARNING on an error, else INFO)."""
    state = printable(status.state, 40) if status is not None else "unknown"
    note = f" note={status.note[:200]!r}" if status is not None and status.note else ""
    if status is not None and status.shortfall_atoms > 0:
        note += f" shortfall={status.shortfall_atoms} atoms"
    if error is not None:
        log.warning("directory %s: state=%s%s: %s", uid, state, note, error)
    else:
        log.info("directory %s: state=%s%s", uid, state, note)
