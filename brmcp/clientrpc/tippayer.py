"""The daemon's payer (BRIDGE.md "Running the daemon", §Embedding the library
in another daemon for ``TipMatcher``; docs/clientrpc.md §Methods brmcp calls,
§Units): :class:`TipPayer` pays with ``PaymentsService.TipUser``
(``dcr_amount`` = atoms / 1e8, :data:`TIP_MAX_ATTEMPTS` attempts) and
returns once the matching terminal ``TipProgress`` event says the tip
completed; a first event saying the attempt failed and will be retried ends
the wait at once (:class:`TipStalledError`: the spend stays pending). A tip
outstanding for over :data:`TIP_SLOW_SECS` s is logged once at INFO with
what it waits for (e.g. brclient's tip restart delay after it starts).

The tip progress events themselves are fed to the :class:`~.tipmatcher.TipMatcher`
by the daemon (:mod:`.daemon`); amounts there are milliatoms
(:mod:`brmcp.protocol.units`).
"""

from __future__ import annotations

import logging

import anyio

from brmcp._ops.clock import Clock, SystemClock, go_duration
from brmcp._ops.payhook import payment_scheduled
from brmcp.clientrpc import Client, ClientrpcConnectionLost, ClientrpcNotConnected, RPCError, atoms_to_dcr
from brmcp.clientrpc.patient import RECONNECT_WAIT, await_connection
from brmcp.clientrpc.tipmatcher import TipMatcher
from brmcp.protocol.units import milliatoms_from_atoms

__all__ = ["TIP_MAX_ATTEMPTS", "TIP_SLOW_SECS", "TipPayer", "TipPaymentError", "TipStalledError"]

#: The daemon's logger: a payment's lines are the daemon's (operators filter on it).
log = logging.getLogger("brmcp.bridge.daemon._daemon")

#: ``TipUser`` invoice attempts per payment (BRIDGE.md §Running the daemon; the Go
#: reference, karamble/brmcp, `cmd/brmcp-serve/main.go`, pays with 3 attempts too).
TIP_MAX_ATTEMPTS = 3
#: Seconds a tip may be outstanding before :class:`TipPayer` logs (once, at
#: INFO) what it waits for: brclient taking it (its ``TipUser`` blocks for
#: brclient's tip restart delay after each start) or its outcome.
TIP_SLOW_SECS = 5.0


class TipPaymentError(Exception):
    """A tip was not paid; the message is shown to the agent after
    ``<name>: payment not made:`` (``brclient not connected``, ``tip: <brclient's
    error>``, ``tip failed: <attempt error>``)."""


class TipStalledError(TipPaymentError):
    """A tip attempt failed and brclient retries it later (e.g. the payee
    has no wallet: the next attempt is a day away): the wait ends now and
    the agent is told at once, but the tip may still land, so the spend
    stays ``pending`` (counted against the day cap) with this reason in its
    ``err`` until brclient's terminal TipProgress settles it: ``paid`` when
    the retry completes, ``failed`` when brclient will not retry
    (:meth:`Bridge.resolve_spend`; :class:`TipMatcher` routes those events
    past newer payments)."""

    may_land = True


class TipPayer:
    """The daemon's :class:`~brmcp.bridge.Payer`: a Bison Relay tip through
    brclient, confirmed by the terminal tip-progress event that ``matcher``
    pairs with it (payee uid lowercase, amount in milliatoms:
    :func:`~brmcp.protocol.units.milliatoms_from_atoms`).

    ``pay`` returns once the tip completed and raises
    :class:`TipPaymentError` when brclient refused it or the tip failed for
    good. If the connection drops after ``TipUser`` was sent, brclient may
    have stored the tip or dropped the request: ``pay`` keeps waiting for
    its outcome (the progress stream resumes after the reconnect) until the
    bridge's tip wait cancels it, which leaves the spend pending and
    counted. It reports the payment as taken by the wallet
    (:func:`brmcp._ops.payhook.payment_scheduled`) only once a progress event for the
    tip comes, so a tip brclient never took blocks a retry of the tool for
    ``tip_wait_secs`` from the payment, not a day (BRIDGE.md §Failures); a
    retry then pays under the callKey it takes over, so a tip that lands
    after all is credit at the bot, never a second run.

    ``max_attempts``: TipUser's ``maxAttempts`` (≥ 1, else ValueError);
    ``reconnect_wait``: seconds a payment waits for a clientrpc connection
    that is down; ``clock``: times the log line of a slow tip
    (:data:`TIP_SLOW_SECS`; wall time by default, as the tip wait).
    """

    def __init__(
        self,
        client: Client,
        matcher: TipMatcher,
        *,
        max_attempts: int = TIP_MAX_ATTEMPTS,
        reconnect_wait: float = RECONNECT_WAIT,
        clock: Clock | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._reconnect_wait = reconnect_wait
        self._client = client
        self._matcher = matcher
        self._max_attempts = max_attempts

    async def pay(self, payee_uid: str, atoms: int) -> None:
        """Tip ``atoms`` atoms to ``payee_uid`` (64 hex) and wait for the outcome.
        A tip still outstanding after :data:`TIP_SLOW_SECS` s (on the payer's
        clock) is logged once at INFO, saying what it waits for."""
        if atoms <= 0:
            raise TipPaymentError(f"cannot tip {atoms} atoms")
        payee = payee_uid.lower()
        tip = _OutstandingTip(payee, atoms, self._max_attempts)
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._note_slow, tip)
            try:
                await self._pay(tip)
            except Exception as exc:
                # Raised below, as itself (not wrapped in a group).
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _pay(self, tip: _OutstandingTip) -> None:
        payee, atoms = tip.payee, tip.atoms
        await await_connection(self._client, self._reconnect_wait)
        if not self._client.connected:
            raise TipPaymentError("brclient not connected")
        waiter = self._matcher.expect(payee, milliatoms_from_atoms(atoms))
        tip.stage = "taking"
        reply_lost = False
        try:
            try:
                await self._client.tip_user(payee, atoms_to_dcr(atoms), self._max_attempts)
            except ClientrpcNotConnected:
                raise TipPaymentError("brclient not connected") from None
            except RPCError as exc:
                raise TipPaymentError(f"tip: {exc}") from None
            except ClientrpcConnectionLost as exc:
                # brclient may have stored the tip or dropped the request with
                # the connection: not known to be taken, so the doubt blocks the
                # tool for tip_wait_secs only (BRIDGE.md §Failures), unless a
                # progress event for it (after the reconnect) shows it exists.
                reply_lost = True
                log.warning(
                    "tip of %d atoms to %s: outcome unknown (%s); waiting for its progress", atoms, payee, exc
                )
            else:
                payment_scheduled()  # stored by brclient: it survives restarts
            tip.stage = "outcome"
            error = await waiter.wait()
            if reply_lost:
                payment_scheduled()  # an event for it came: brclient has it
        finally:
            waiter.cancel()
        if waiter.stalled:
            raise TipStalledError(
                f"tip cannot complete now: {error}; brclient retries it later, so it may still land"
                " (the spend log records it)"
            )
        if error is not None:
            raise TipPaymentError(f"tip failed: {error}")

    async def _note_slow(self, tip: _OutstandingTip) -> None:
        """Log once what a tip waits for once it is outstanding
        :data:`TIP_SLOW_SECS` s (cancelled when the tip's wait ends)."""
        await self._clock.sleep(TIP_SLOW_SECS)
        log.info("%s", tip.describe(TIP_SLOW_SECS))


class _OutstandingTip:
    """One :meth:`TipPayer.pay` in progress: payee uid (lowercase hex),
    ``atoms``, TipUser's ``maxAttempts``, and how far it got: ``stage`` is
    ``"connecting"`` (waiting for the clientrpc connection), ``"taking"``
    (TipUser sent, not returned) or ``"outcome"`` (brclient took the tip;
    waiting for its terminal TipProgress event)."""

    __slots__ = ("atoms", "max_attempts", "payee", "stage")

    def __init__(self, payee: str, atoms: int, max_attempts: int) -> None:
        self.payee = payee
        self.atoms = atoms
        self.max_attempts = max_attempts
        self.stage = "connecting"

    def describe(self, waited: float) -> str:
        """The log line for a tip outstanding ``waited`` seconds."""
        head = f"tip of {self.atoms} atoms to bot {self.payee}"
        so_far = go_duration(waited)
        if self.stage == "connecting":
            return f"{head}: waiting for the clientrpc connection to brclient ({so_far} so far)"
        if self.stage == "taking":
            return (
                f"{head}: waiting for brclient to take it ({so_far} so far): after brclient starts, its"
                " TipUser waits until its tip restart delay ([tipuser] restartdelay in brclient.conf,"
                " brnet's -tiprestartdelay; 1m0s by default) has passed since it connected to the"
                " relay, so the first paid call after a brclient start can take that long"
            )
        return (
            f"{head}: waiting for brclient to complete it (attempt 1 of {self.max_attempts},"
            f" {so_far} so far): brclient makes one tip at a time to each payee and needs an invoice"
            " from the payee, which must be online; an attempt that fails is retried by brclient after"
            " [tipuser] rerequestinvoicedelay (24h0m0s by default), and this wait then ends with the"
            " spend left pending"
        )
