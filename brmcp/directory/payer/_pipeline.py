"""The verification pipeline (docs/directory.md §Lifecycle; karamble/brmcp,
``directory/pipeline.go``)::

    register -> awaiting_funding -> crawling -> testing -> pending_review
                                                       \\-> listed (renewal)

* ``register`` stores the application (last write wins while it is not
  being verified; during a crawl or test the running one continues and the
  answer says so) and answers with the funding invoice.
* Every credited tip re-checks funding: once the provider's balance covers
  fee plus test budget the fee is debited and the run starts, in one
  transaction.
* The run crawls ``tools/list``, stores the catalog and the test's callKey,
  then makes the paid test call out of the provider's escrow. A first
  registration then waits in ``pending_review``; a passed renewal is listed
  at once, and a failed one parks without touching the live listing.
  Failures park with the error; nothing is retried on its own.
* The sweep removes lapsed listings and re-crawls stale catalogs for free
  (``catalogCheckedAt`` moves; ``lastVerifiedExecution`` moves only on a
  paid test).
* A run found ``crawling`` or ``testing`` at start continues, the test
  under the callKey it stored, so the provider executes and charges it once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import secrets
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
from mcp import ClientSession

from brmcp._ops.clock import Clock
from brmcp.protocol.receipts import (
    ReceiptError,
    receipt_key_from_meta,
    signed_receipt_from_meta,
    verify_receipt,
)

from ..db import DirectoryStore, Listing, Registration, pool_from_meta, set_listed_pool, set_run_pool
from ..model import (
    STATE_AWAITING_FUNDING,
    STATE_CRAWLING,
    STATE_LISTED,
    STATE_NONE,
    STATE_PENDING_REVIEW,
    STATE_REJECTED,
    STATE_TESTING,
    Policy,
    RegisterIn,
    StatusOut,
    validate_register,
)
from ._client import CallError, CallOutcome, ProviderClient, catalog_json, listing_in, result_text

__all__ = ["BUSY_NOTE", "Pipeline", "new_call_key"]

log = logging.getLogger("brmcp.directory")

#: ``register``'s note while the previous registration is being verified.
BUSY_NOTE = "verification in progress; the previous registration continues"
#: The note of a ``register`` while a verified application awaits review.
VERIFIED_NOTE = "verified; the application awaits the operator's review and stands unchanged"


def new_call_key() -> str:
    """A fresh callKey: 16 random bytes as 32 hex digits (Go's ``newCallKey``)."""
    return secrets.token_hex(16)


class Pipeline:
    """One directory's registrations. ``self_uid()`` is the directory's own
    uid once known (it cannot list itself). Runs are started as tasks of
    the task group given to :meth:`bind` (the directory's), one per uid.
    ``on_change(uid)`` is called after every committed change of a uid's
    registration or listing (:meth:`changed`); it must not block."""

    def __init__(
        self,
        *,
        store: DirectoryStore,
        client: ProviderClient,
        policy: Policy,
        clock: Clock,
        self_uid: Callable[[], str | None],
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._on_change = on_change
        self._client = client
        self._policy = policy
        self._clock = clock
        self._self_uid = self_uid
        self._tg: anyio.abc.TaskGroup | None = None
        self._inflight: set[str] = set()
        self._idle = anyio.Event()
        self._idle.set()

    @property
    def expiry_seconds(self) -> int:
        return self._policy.expiry_days * 86_400

    def _now(self) -> int:
        return int(self._clock.now())

    def bind(self, tg: anyio.abc.TaskGroup | None) -> None:
        """Start runs in ``tg`` from now on (None: stop starting them)."""
        self._tg = tg

    def changed(self, uid: str) -> None:
        """``uid``'s registration or listing changed (called after the
        commit): the ``on_change`` hook (push status, statuspush.py)."""
        if self._on_change is not None:
            self._on_change(uid)

    @property
    def inflight(self) -> frozenset[str]:
        """Uids whose run is executing now."""
        return frozenset(self._inflight)

    async def wait_idle(self) -> None:
        """Return once no run is executing."""
        while self._inflight:
            await self._idle.wait()

    def spawn(self, uid: str) -> bool:
        """Start the run of ``uid`` unless one is executing or the
        directory is not serving; returns whether it started."""
        if self._tg is None or uid in self._inflight:
            return False
        self._inflight.add(uid)
        self._idle = anyio.Event()
        self._tg.start_soon(self._run_task, uid, name=f"brmcpdir-pipeline-{uid[:8]}")
        return True

    async def _run_task(self, uid: str) -> None:
        try:
            await self.run(uid)
        except Exception:
            log.exception("pipeline of %s stopped on an unexpected error", uid[:8])
        finally:
            self._inflight.discard(uid)
            if not self._inflight:
                self._idle.set()

    # -- the public entry points ----------------------------------------------------

    async def register(self, peer: str, application: RegisterIn) -> StatusOut:
        """``register`` for ``peer``: the funding invoice (or the running
        run's state with :data:`BUSY_NOTE`). Raises ValueError naming the
        field for an invalid application, or when ``peer`` is the directory."""
        me = self._self_uid()
        if me and peer == me:
            raise ValueError("the directory cannot list itself")
        clean = validate_register(application, self._policy.test_budget_max_atoms)
        reg = Registration(
            uid=peer,
            reg_id=secrets.token_hex(8),
            state=STATE_AWAITING_FUNDING,
            description=clean.description,
            tags=clean.tags,
            test=clean.test,
            fee_atoms=self._policy.listing_fee_atoms,
            budget_atoms=clean.test.max_atoms,
            renewal=False,
            created_at=self._now(),
        )
        stored = await self._store.register(reg)
        if stored:
            self.changed(peer)
            await self.poke_funding(peer)
        status = await self.status(peer)
        if not stored:
            note = VERIFIED_NOTE if status.state == STATE_PENDING_REVIEW else BUSY_NOTE
            return dataclasses.replace(status, note=note)
        return status

    async def status(self, peer: str) -> StatusOut:
        """``my_status``: the run's state (with the invoice while awaiting
        funding, the failure while parked), else the listing, the
        rejection, or ``none``."""
        live, reg, flag = await self._store.entry(peer)
        if reg is not None:
            out: dict[str, Any] = {
                "state": reg.state,
                "fee_atoms": reg.fee_atoms,
                "test_budget_atoms": reg.budget_atoms,
            }
            if reg.state == STATE_AWAITING_FUNDING:
                required = reg.fee_atoms + reg.budget_atoms
                balance = await self._store.balance(peer)
                out.update(
                    required_atoms=required,
                    balance_atoms=balance,
                    shortfall_atoms=max(0, required - balance),
                )
            if reg.state == STATE_PENDING_REVIEW and reg.test_err:
                out["note"] = reg.test_err
            return StatusOut(**out)
        if live is not None:
            return StatusOut(state=STATE_LISTED, expires_at=live.expires_at, note=flag)
        if flag:
            return StatusOut(state=STATE_REJECTED, note=flag)
        return StatusOut(state=STATE_NONE)

    async def poke_funding(self, uid: str) -> None:
        """Start ``uid``'s run when its balance now covers fee plus budget."""
        if await self._store.start_if_funded(uid, self._now()):
            self.changed(uid)
            log.info("registration of %s funded; verification starts", uid[:8])
            self.spawn(uid)

    async def resume(self) -> None:
        """At start: continue runs left crawling or testing, and re-check
        the funding of those awaiting it."""
        for reg in await self._store.registrations():
            if reg.state in (STATE_CRAWLING, STATE_TESTING):
                self.spawn(reg.uid)
            elif reg.state == STATE_AWAITING_FUNDING:
                await self.poke_funding(reg.uid)

    async def approve(self, uid: str) -> None:
        """Publish a parked registration whose test passed (ValueError otherwise)."""
        await self._store.approve(uid, self._now(), self.expiry_seconds)
        self.changed(uid)

    async def spot_check(self, uid: str) -> None:
        """``run_verification``: a fresh paid test of a live listing, funded
        by the provider's residual balance (ValueError when it cannot run)."""
        await self._store.spot_check(uid, secrets.token_hex(8), new_call_key(), self._now())
        self.changed(uid)
        self.spawn(uid)

    # -- a run ------------------------------------------------------------------------

    async def run(self, uid: str) -> None:
        """Advance ``uid``'s run from its stored state through crawl and
        test (cancellation leaves the stored state for the next start)."""
        reg = await self._store.registration(uid)
        if reg is None or reg.state not in (STATE_CRAWLING, STATE_TESTING):
            return
        # One session for the crawl and the test (a provider admits few
        # sessions per peer); the test's retry opens a fresh one.
        async with contextlib.AsyncExitStack() as stack:
            try:
                session = await stack.enter_async_context(self._client.session(uid))
            except CallError as exc:
                await self._park(reg, f"{'crawl' if reg.state == STATE_CRAWLING else 'test'}: {exc}")
                return
            if reg.state == STATE_CRAWLING:
                meta: dict[str, Any] = {}
                try:
                    tools = await self._client.crawl(uid, session, meta=meta)
                except CallError as exc:
                    await self._park(reg, f"crawl: {exc}")
                    return
                receipt_key = receipt_key_from_meta(meta) or ""
                # The crawled pool (docs/directory.md §Reputation) is recorded
                # for this run before the run moves on: a start that finds it
                # testing has it, one that finds it crawling crawls again.
                await self._store.run(
                    functools.partial(
                        set_run_pool,
                        uid=uid,
                        reg_id=reg.reg_id,
                        pool=pool_from_meta(meta, uid, receipt_key),
                    )
                )
                moved = await self._store.to_testing(
                    uid, reg.reg_id, catalog_json(tools), new_call_key(), receipt_key=receipt_key
                )
                if moved is None:
                    return
                self.changed(uid)
                reg = moved
            error, latency, verified = await self._test(reg, session)
        outcome = await self._store.finish_test(
            uid,
            reg.reg_id,
            error=error,
            latency_ms=latency,
            now=self._now(),
            expiry_seconds=self.expiry_seconds,
            receipt_verified=verified,
        )
        self.changed(uid)
        if outcome == STATE_LISTED:
            log.info("renewed %s", uid[:8])
        elif outcome:
            log.info(
                "%s %s: %s", uid[:8], "awaits review" if not error else "parked for review", error or "ok"
            )

    async def _park(self, reg: Registration, error: str) -> None:
        await self._store.park(reg.uid, reg.reg_id, error)
        self.changed(reg.uid)
        log.info("%s parked for review: %s", reg.uid[:8], error)

    async def _test(self, reg: Registration, session: ClientSession) -> tuple[str, int, bool]:
        """The paid test: ``("", latency_ms, receipt_verified)`` when it
        passed, else the error first (see :meth:`_receipt_verified`)."""
        cap = min(reg.test.max_atoms, reg.remaining_atoms)
        try:
            outcome = await self._client.paid_call(
                reg.uid,
                reg.test.tool,
                dict(reg.test.args) if reg.test.args else None,
                call_key=reg.call_key,
                cap=cap,
                listing=listing_in(reg.catalog, reg.test.tool),
                escrow_reg=reg.reg_id,
                session=session,
            )
        except CallError as exc:
            return str(exc), 0, False
        verified = await self._receipt_verified(reg, outcome)
        if outcome.result.is_error:
            error = result_text(outcome.result) or "the test call returned a tool error"
            return error, outcome.latency_ms, verified
        return "", outcome.latency_ms, verified

    async def _receipt_verified(self, reg: Registration, outcome: CallOutcome) -> bool:
        """Whether the test result's signed receipt (``brmcp/signedReceipt``)
        verifies against the key the run's crawl read (a run that did not
        crawl: the listing's), names the directory as its caller (when its
        uid is known), no other bot, and the tested tool. False without a
        receipt or a key."""
        signed = signed_receipt_from_meta(outcome.result.meta)
        if signed is None:
            return False
        key = await self._store.judging_key(reg.uid, reg.reg_id)
        if not key:
            return False
        try:
            claims = verify_receipt(signed, key)
        except ReceiptError as exc:
            log.info("test receipt of %s refused: %s", reg.uid[:8], exc)
            return False
        me = self._self_uid()
        return (
            (not me or claims.caller == me) and claims.bot in ("", reg.uid) and claims.tool == reg.test.tool
        )

    # -- maintenance ----------------------------------------------------------------------

    async def sweep(self) -> None:
        """One maintenance pass: lapsed listings removed, catalogs older
        than ``recrawl_hours`` re-crawled, stalled funding re-checked."""
        now = self._now()
        stale = self._policy.recrawl_hours * 3600
        for live in await self._store.listings():
            if live.expires_at <= now:
                if await self._store.expire(live.uid, now):
                    self.changed(live.uid)
                    log.info("listing %s expired", live.uid[:8])
            elif now - live.catalog_checked_at >= stale:
                await self.recrawl(live.uid)
        for reg in await self._store.registrations():
            if reg.state == STATE_AWAITING_FUNDING:
                await self.poke_funding(reg.uid)

    async def recrawl(self, uid: str) -> Listing | None:
        """Re-read a live listing's catalog for free; the listing after it
        (unchanged when the crawl failed), or None when not listed. Every
        attempt's outcome joins the provider's history, and a successful
        crawl's receipt key and pool (or their absence) replace the
        listing's (a pool shows only under its own receipt key:
        :func:`brmcp.directory.db.shown_pool`)."""
        meta: dict[str, Any] = {}
        try:
            tools = await self._client.crawl(uid, meta=meta)
        except CallError as exc:
            log.info("recrawl %s: %s", uid[:8], exc)
            return await self._store.recrawl_failed(uid, self._now())
        receipt_key = receipt_key_from_meta(meta) or ""
        live = await self._store.recrawled(uid, catalog_json(tools), self._now(), receipt_key=receipt_key)
        if live is not None:
            pool = pool_from_meta(meta, uid, receipt_key)
            await self._store.run(functools.partial(set_listed_pool, uid=uid, pool=pool))
        return live
