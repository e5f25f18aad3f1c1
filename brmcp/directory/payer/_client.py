"""The directory as a customer: dial a provider through the directory's own
router, crawl its ``tools/list``, and make paid calls under a hard bound
(docs/directory.md §Money; karamble/brmcp, ``directory/client.go``).

A paid call is one logical call under one ``brmcp/callKey``: at most one
transport retry on a fresh session, and at most one payment, judged as the
bridge judges a refusal (:class:`brmcp.protocol.listing.CallTally` against the
tool's listing in the crawled catalog) and capped at ``cap`` atoms. Before
money moves the payment is written to the spend journal and, for a test, the
atoms are debited from the provider's escrow, in one transaction
(:meth:`.store.DirectoryStore.launch_spend`); only a definitive rail failure
removes the row and returns the escrow. After paying, the call is re-issued
under the same key, polling for the credit a bounded number of times on the
injected clock.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio
import anyio.lowlevel
from mcp import ClientSession
from mcp.types import (
    CallToolResult,
    Implementation,
    PaginatedRequestParams,
    RequestParamsMeta,
    TextContent,
    Tool,
)

from brmcp._ops import gojson
from brmcp._ops.clock import Clock
from brmcp.protocol.listing import CallTally, Listing, listing_of
from brmcp.protocol.payment import CALL_KEY, parse_payment_required
from brmcp.transport.conn import Conn
from brmcp.transport.router import Router

from ..db import DirectoryStore

__all__ = [
    "MAX_CATALOG_PAGES",
    "CallError",
    "CallOutcome",
    "Payer",
    "ProviderClient",
    "Timeouts",
    "catalog_json",
    "listing_in",
    "result_json",
    "result_text",
]

log = logging.getLogger("brmcp.directory")

#: Pages of ``tools/list`` one crawl follows at most.
MAX_CATALOG_PAGES = 16


class Payer(Protocol):
    """Settles one payment (the same shape as :class:`brmcp.bridge.Payer`):
    returns once ``atoms`` atoms reached ``payee_uid`` and raises otherwise.
    An exception with a true ``may_land`` attribute, a timeout or a
    cancellation leave the outcome in doubt (the spend stays journaled);
    any other exception is a definitive failure (no money left)."""

    async def pay(self, payee_uid: str, atoms: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds each step may take (Go's ``client.go`` constants): opening
    a session, one crawl, one call, one payment; and the credit polls after
    a payment (``credit_polls`` re-issues ``credit_poll_delay`` apart, on
    the directory's clock)."""

    dial: float = 120.0
    crawl: float = 120.0
    call: float = 600.0
    pay: float = 180.0
    credit_polls: int = 6
    credit_poll_delay: float = 3.0


class CallError(Exception):
    """A crawl or paid call that did not produce a result; the message is
    what a registration's ``testErr`` shows."""


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """A call's answer (possibly a tool error), the atoms paid for it by
    this attempt, and the latency of the answering request in ms."""

    result: CallToolResult
    paid_atoms: int
    latency_ms: int


def result_json(result: CallToolResult | None) -> str:
    """The result's text contents joined with newlines (what a JSON answer
    is decoded from)."""
    if result is None:
        return ""
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def result_text(result: CallToolResult | None) -> str:
    """:func:`result_json` cut to 512 characters, for diagnostics."""
    return result_json(result)[:512]


def catalog_json(tools: list[dict[str, Any]]) -> str:
    """A crawled tools array as the compact JSON text stored and served."""
    return gojson.dumps(tools)


def listing_in(catalog: str, tool: str) -> Listing:
    """The :class:`Listing` of ``tool`` in a stored catalog (free when the
    tool is absent or the catalog does not parse: never paid)."""
    try:
        tools = json.loads(catalog) if catalog else []
    except ValueError:
        return Listing("free")
    for item in tools if isinstance(tools, list) else []:
        if isinstance(item, dict) and item.get("name") == tool:
            try:
                return listing_of(Tool.model_validate(item))
            except ValueError:
                return Listing("free")
    return Listing("free")


@contextlib.asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """Re-raise the one exception an SDK session's task group wrapped in a
    group (a :class:`CallError` raised in the session's body stays one)."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if leaf is group:
            raise
        raise leaf from None


class ProviderClient:
    """Outbound MCP sessions from the directory. ``router`` returns the
    directory harness's router (None before start); ``store`` journals
    spends; ``payer`` pays; ``clock`` paces the credit polls."""

    def __init__(
        self,
        router: Callable[[], Router | None],
        *,
        name: str,
        clock: Clock,
        payer: Payer,
        store: DirectoryStore,
        timeouts: Timeouts,
    ) -> None:
        self._router = router
        self._info = Implementation(name=name, version="0.1.0")
        self._clock = clock
        self._payer = payer
        self._store = store
        self.timeouts = timeouts
        self._open: set[Conn] = set()
        self._conn_of: dict[ClientSession, Conn] = {}

    def close_all(self) -> None:
        """Close every outbound session now, without a word to the peers
        (at shutdown, before the calls are cancelled: a provider must not
        hear ``notifications/cancelled`` for a test the next start re-issues
        under the same callKey, or it would record the call as cancelled)."""
        for conn in list(self._open):
            conn.close()
        self._open.clear()

    @contextlib.asynccontextmanager
    async def session(self, uid: str) -> AsyncIterator[ClientSession]:
        """An initialized session with ``uid`` on a fresh sid; raises
        :class:`CallError` when it cannot be opened within ``timeouts.dial``."""
        router = self._router()
        if router is None:
            raise CallError("no router; not started")
        try:
            conn = router.dial(uid)
        except RuntimeError as exc:
            raise CallError(str(exc)) from None
        self._open.add(conn)
        try:
            async with (
                _unwrapped(),
                ClientSession(conn.read_stream, conn.write_stream, client_info=self._info) as session,
            ):
                try:
                    with anyio.fail_after(self.timeouts.dial):
                        await session.initialize()
                except TimeoutError:
                    await anyio.lowlevel.checkpoint_if_cancelled()  # a shutdown is not a failure
                    raise CallError(
                        f"connect to {uid[:8]}: no answer within {self.timeouts.dial:g}s"
                    ) from None
                except CallError:
                    raise
                except Exception as exc:
                    await anyio.lowlevel.checkpoint_if_cancelled()  # a shutdown is not a failure
                    raise CallError(f"connect to {uid[:8]}: {exc or type(exc).__name__}") from None
                self._conn_of[session] = conn
                try:
                    yield session
                finally:
                    self._conn_of.pop(session, None)
        finally:
            self._open.discard(conn)
            conn.close()

    async def crawl(
        self, uid: str, session: ClientSession | None = None, *, meta: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """``uid``'s tools as listed (every page, at most
        :data:`MAX_CATALOG_PAGES`), each tool as its JSON object with the
        ``_meta`` prices, over ``session`` or a new one. ``meta``, when
        given, receives the first page's result ``_meta`` (where a bot
        announces its receipt key). Raises :class:`CallError`."""
        tools: list[dict[str, Any]] = []
        async with contextlib.AsyncExitStack() as stack:
            if session is None:
                session = await stack.enter_async_context(self.session(uid))
            cursor: str | None = None
            try:
                with anyio.fail_after(self.timeouts.crawl):
                    for _ in range(MAX_CATALOG_PAGES):
                        params = PaginatedRequestParams(cursor=cursor) if cursor else None
                        page = await session.list_tools(params=params)
                        if meta is not None and cursor is None and isinstance(page.meta, dict):
                            meta.update(page.meta)
                        tools.extend(
                            t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools
                        )
                        cursor = page.next_cursor
                        if not cursor:
                            break
            except TimeoutError:
                await anyio.lowlevel.checkpoint_if_cancelled()  # a shutdown is not a failure
                raise CallError(f"list tools: no answer within {self.timeouts.crawl:g}s") from None
            except Exception as exc:
                await anyio.lowlevel.checkpoint_if_cancelled()  # a shutdown is not a failure
                raise CallError(f"list tools: {exc or type(exc).__name__}") from None
        return tools

    async def paid_call(
        self,
        uid: str,
        tool: str,
        arguments: dict[str, Any] | None,
        *,
        call_key: str,
        cap: int,
        listing: Listing,
        escrow_reg: str | None,
        session: ClientSession | None = None,
    ) -> CallOutcome:
        """Call ``tool`` on ``uid`` under ``call_key``, paying at most once
        and at most ``cap`` atoms (``cap`` <= 0: never pay), judged against
        ``listing``. ``escrow_reg`` (a registration's ``reg_id``) makes the
        payment come out of ``uid``'s balance; None pays out of the
        directory's pocket. ``session`` (kept open) serves the first attempt
        instead of a new one. A call whose key already has a journaled
        payment (a resumed test) pays nothing more. Raises
        :class:`CallError` for no answer, a refusal not paid, a payment
        that failed, or a credit that never landed."""
        prior = await self._store.spends(uid, call_key)
        budget = CallTally(listing)
        for entry in prior:
            budget.add(entry.atoms)
        paid = bool(prior)
        polls = 0
        retried = False
        paid_now = 0
        meta = cast("RequestParamsMeta", {CALL_KEY: call_key})
        async with contextlib.AsyncExitStack() as stack:
            if session is None:
                session = await stack.enter_async_context(self.session(uid))
            while True:
                started = self._clock.now()
                try:
                    answer = await self._call(session, tool, arguments or {}, meta)
                    if not isinstance(answer, CallToolResult):
                        raise CallError(f"{tool}: unexpected answer {type(answer).__name__}")
                except Exception as exc:
                    await anyio.lowlevel.checkpoint_if_cancelled()  # a shutdown is not a failure
                    reason = (
                        f"no answer within {self.timeouts.call:g}s"
                        if isinstance(exc, TimeoutError)
                        else str(exc) or type(exc).__name__
                    )
                    if retried:
                        raise CallError(f"call {tool}: {reason}") from None
                    retried = True
                    log.info("call %s on %s failed (%s); one retry on a fresh session", tool, uid[:8], reason)
                    await stack.aclose()
                    session = await stack.enter_async_context(self.session(uid))
                    continue
                refusal = parse_payment_required(answer)
                if refusal is None:
                    latency = max(0, round((self._clock.now() - started) * 1000))
                    return CallOutcome(answer, paid_now, latency)
                if paid:
                    if polls < self.timeouts.credit_polls:
                        polls += 1
                        await self._clock.sleep(self.timeouts.credit_poll_delay)
                        continue
                    raise CallError("payment made but the call still refuses; credit did not land")
                verdict = budget.judge(tool, refusal, cap)
                if verdict.decline is not None:
                    raise CallError(f"payment not made: {verdict.decline}")
                amount = verdict.amount
                if amount > cap:
                    raise CallError(f"quote {amount} atoms exceeds the {max(cap, 0)} atom budget")
                await self._pay(uid, tool, amount, call_key, escrow_reg)
                paid = True
                paid_now += amount
                budget.add(amount)

    async def _call(
        self, session: ClientSession, tool: str, arguments: dict[str, Any], meta: RequestParamsMeta
    ) -> CallToolResult:
        """``tools/call`` bounded by ``timeouts.call``: raises TimeoutError
        when it expires. The session's transport is closed first, without a
        word to the provider: cancelling the SDK request would send
        ``notifications/cancelled``, the provider would record the call as
        cancelled, and the re-issue under the same callKey (a paid one
        included) would only replay that. Closed silently, the provider
        finishes the call and the re-issue gets its outcome."""
        conn = self._conn_of.get(session)
        answer: CallToolResult | None = None
        failure: Exception | None = None
        expired = False
        async with anyio.create_task_group() as tg:

            async def expire() -> None:
                nonlocal expired
                await anyio.sleep(self.timeouts.call)
                expired = True
                if conn is not None:
                    conn.close()
                tg.cancel_scope.cancel()

            tg.start_soon(expire, name="brmcpdir-call-deadline")
            try:
                answer = await session.call_tool(tool, arguments, meta=meta)
            except Exception as exc:  # raised below, outside the task group
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if expired or (answer is None and failure is None):
            raise TimeoutError(f"{tool}: no answer within {self.timeouts.call:g}s")
        if failure is not None:
            raise failure
        assert answer is not None
        return answer

    async def _pay(self, uid: str, tool: str, amount: int, call_key: str, escrow_reg: str | None) -> None:
        now = int(self._clock.now())
        entry = await self._store.launch_spend(
            uid=uid, tool=tool, atoms=amount, call_key=call_key, ts=now, escrow_reg=escrow_reg
        )
        if entry is None:
            raise CallError(f"escrow debit: the provider's balance does not cover {amount} atoms")
        try:
            with anyio.fail_after(self.timeouts.pay):
                await self._payer.pay(uid, amount)
        except TimeoutError:
            await anyio.lowlevel.checkpoint_if_cancelled()  # a shutdown is not a failure
            raise CallError(
                f"payment of {amount} atoms not confirmed within {self.timeouts.pay:g}s; it may still land"
            ) from None
        except Exception as exc:
            await anyio.lowlevel.checkpoint_if_cancelled()  # a shutdown is not a failure
            if getattr(exc, "may_land", False):
                raise CallError(f"payment of {amount} atoms in doubt: {exc}") from None
            await self._store.spend_failed(entry.id, int(self._clock.now()))
            raise CallError(f"payment: {exc or type(exc).__name__}") from None
        await self._store.spend_paid(entry.id)
