"""The host's one outbound primitive: send PM text to a peer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

__all__ = ["PMSender", "SendError", "SenderFunc"]


@runtime_checkable
class PMSender(Protocol):
    """Sends one private message.

    ``peer`` is the recipient's Bison Relay uid as 64 lowercase hex
    characters; ``text`` is one PM body (one envelope part for MCP traffic).
    Implementations raise any exception when the PM could not be handed to
    the relay; the transport turns that into a session failure.

    Returning is the signal that the PM left this side (brclient's ``PM``
    call returned): the bridge starts a request's re-send timer then, not
    while the PM still waits, e.g. in brclient's paced queue
    (:class:`~brmcp.transport.conn.SendReceipt`; BRIDGE.md §Deadlines and re-sends).
    """

    async def send_pm(self, peer: str, text: str) -> None:
        """Send ``text`` to ``peer``; return once the PM was accepted for
        delivery (a sender that returns while the PM still waits makes the
        bridge time that wait as part of the round trip, and may let it send
        another copy into the same queue)."""
        ...


class SenderFunc:
    """Adapt a plain ``async (peer, text) -> None`` function into a :class:`PMSender`."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[str, str], Awaitable[None]]) -> None:
        self._fn = fn

    async def send_pm(self, peer: str, text: str) -> None:
        await self._fn(peer, text)


class SendError(Exception):
    """A PM of a session could not be sent; the session is closed.

    The message reads ``brmcp: send to <peer>: <cause>`` as in the Go
    reference; ``peer`` and the original exception (``__cause__``) are kept.
    """

    def __init__(self, peer: str, cause: BaseException) -> None:
        super().__init__(f"brmcp: send to {peer}: {cause}")
        self.peer = peer
