"""Sending one request of a logical call to its bot (BRIDGE.md §The payment
flow, §Pay alongside and prepay): over the bot's link or its pool, withdrawn
when the payment made alongside fails or the agent goes away, and the
``_meta`` the bridge adds to a request or strips from a result.
:class:`~._payloop.PaymentLoop` builds the payment loop on it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import anyio
from mcp.types import CallToolRequest, CallToolResult, RequestParamsMeta, TextContent

from brmcp.bridge.links import AgentCall, BotLink, strip_reserved_meta
from brmcp.protocol.payment import CALL_KEY

from ._funding import Funding
from ._shares import Payment, Share

if TYPE_CHECKING:
    from ._pools import Pools

__all__ = [
    "DUPLICATE_REFUSED",
    "WITHDRAWN",
    "Alongside",
    "RequestSender",
    "Withdrawn",
    "asks_to_retry",
    "clean_result",
    "needs_back_channel",
    "with_key",
    "with_meta",
]


#: How the harness answers a duplicate whose original it refused before
#: running (WIRE.md §callKey); the bridge then simply asks again.
DUPLICATE_REFUSED = "duplicate call: the original call with this callKey was refused"


class Withdrawn:
    """The type of :data:`WITHDRAWN`."""

    __slots__ = ()


#: :meth:`RequestSender._send`: the call was withdrawn because the payment made
#: alongside failed; ask again unmarked.
WITHDRAWN = Withdrawn()


class Alongside:
    """The payment made alongside one call, while its budget does not count
    it, the call's share of the credit at the bot (:mod:`.funding`), and
    the link of the bot that gave the last answer (a pool member,
    :mod:`.pools`; None: the call's own bot)."""

    __slots__ = ("funding", "member", "payment", "share")

    def __init__(self) -> None:
        self.payment: Payment | None = None
        self.funding: Funding | None = None
        self.share: Share | None = None
        self.member: BotLink | None = None


def asks_to_retry(result: CallToolResult) -> bool:
    """The bot's answer to a duplicate whose original it refused before
    running: an error naming the callKey that asks for a retry with it."""
    if not result.is_error or len(result.content) != 1:
        return False
    first = result.content[0]
    return isinstance(first, TextContent) and first.text.startswith(DUPLICATE_REFUSED)


#: The MCP SDK's tool error when a modern-era session cannot carry a request
#: from the bot (sampling, elicitation) back to the caller.
_BACK_CHANNEL_TEXT = "no back-channel for server-initiated requests"


def needs_back_channel(result: CallToolResult) -> bool:
    return any(isinstance(c, TextContent) and _BACK_CHANNEL_TEXT in c.text for c in result.content)


def with_key(request: CallToolRequest, key: str) -> CallToolRequest:
    return with_meta(request, {CALL_KEY: key})


def with_meta(request: CallToolRequest, extra: dict[str, Any]) -> CallToolRequest:
    """``request`` with ``extra`` merged into its ``_meta``."""
    meta = {**dict(request.params.meta or {}), **extra}
    params = request.params.model_copy(update={"meta": cast(RequestParamsMeta, meta)})
    return request.model_copy(update={"params": params})


def clean_result(result: CallToolResult) -> CallToolResult:
    if not result.meta:
        return result
    return result.model_copy(update={"meta": strip_reserved_meta(result.meta)})


class RequestSender:
    """Sends the requests of the calls to one bot: over ``link``, or spread
    across its pool (``pools``, :mod:`._pools`; None: ``link`` only)."""

    link: BotLink
    pools: Pools | None

    async def _exchange(
        self,
        request: CallToolRequest,
        progress: Any,
        quiet: anyio.Event | None,
        deadline: float | None,
        alongside: Alongside,
        tracked: AgentCall | None,
    ) -> CallToolResult:
        """One request of the call, over ``link`` or its pool (:mod:`.pools`);
        ``alongside.member`` is set to the link that answered."""
        if self.pools is None:
            alongside.member = self.link
            return await self.link.exchange(
                request, CallToolResult, progress=progress, quiet=quiet, deadline=deadline
            )
        result, member = await self.pools.exchange(
            self.link, request, progress=progress, quiet=quiet, deadline=deadline, call=tracked
        )
        alongside.member = member
        return result

    async def _send(
        self,
        request: CallToolRequest,
        progress: Any,
        ahead: Payment | None,
        gone: anyio.Event | None,
        deadline: float | None,
        alongside: Alongside,
        tracked: AgentCall | None,
    ) -> CallToolResult | Withdrawn | None:
        """:meth:`BotLink.exchange` of ``request``. While a payment made
        alongside is still under way the bot may hold the call
        (WIRE.md §Pay alongside); the call is withdrawn (the bot is told the
        request is cancelled, so a held call ends without a charge):

        * when the agent goes away: None is returned;
        * when the payment fails (a tip that cannot complete now may still
          land later): :data:`WITHDRAWN` is returned, and the caller asks
          again unmarked under the same callKey, so the bot's answer decides
          at once (the result, when the credit came after all or the call
          already ran; else its refusal) instead of after its hold."""
        if ahead is None or ahead.done:
            return await self._exchange(request, progress, None, deadline, alongside, tracked)
        outcome: list[CallToolResult | BaseException] = []
        withdrawn = False
        async with anyio.create_task_group() as tg:

            async def watch_agent(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            async def watch_payment(payment: Payment) -> None:
                nonlocal withdrawn
                if await payment.wait() is not None:
                    withdrawn = True
                    tg.cancel_scope.cancel()

            if gone is not None:
                tg.start_soon(watch_agent, gone)
            tg.start_soon(watch_payment, ahead)
            try:
                outcome.append(
                    await self._exchange(request, progress, ahead.settled, deadline, alongside, tracked)
                )
            except Exception as exc:
                outcome.append(exc)
            tg.cancel_scope.cancel()
        if not outcome:
            return WITHDRAWN if withdrawn and (gone is None or not gone.is_set()) else None
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]
