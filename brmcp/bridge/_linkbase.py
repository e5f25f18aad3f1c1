"""What every part of a bot link shares (:mod:`.link`, :mod:`._exchange`,
:mod:`._toolsnap`): its error (:class:`LinkError`), the hint given when a
bot does not answer, the record of one BR session (:class:`_Session`), the
transport error codes and the connect limit.
"""

from __future__ import annotations

import logging

import anyio
from mcp import ClientSession
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, Tool

from ..conn import Conn
from .snapshots import Era

__all__ = ["CONNECT_TIMEOUT", "TRANSPORT_ERROR_CODES", "LinkError", "no_answer_hint"]

log = logging.getLogger("brmcp.bridge")

#: Limit for initialize and for the tools/list snapshot (seconds).
CONNECT_TIMEOUT = 120.0
#: MCPError codes the SDK raises itself when the BR session failed (as
#: opposed to an error the bot answered with).
TRANSPORT_ERROR_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT})


class LinkError(Exception):
    """The bot could not be reached: dialing, initialize or tools/list failed."""


def no_answer_hint(bot: str, seconds: float, own_uid: str | None) -> str:
    """The message an agent gets when a bot does not answer ``initialize``
    (issue 11 §6): the two usual causes, named."""
    mine = own_uid if own_uid else "(this bridge's uid)"
    return (
        f"no answer from bot {bot} in {seconds:g} s: "
        f"is it online, and is your uid {mine} on its allowed_uids?"
    )


class _Session:
    __slots__ = (
        "conn",
        "done",
        "era",
        "error",
        "gen",
        "offer",
        "prefetched",
        "ready",
        "retired",
        "session",
        "stop",
        "switch",
        "users",
    )

    def __init__(self, gen: int, conn: Conn, era: Era, *, offer: bool = False) -> None:
        self.gen = gen
        self.conn = conn
        self.era: Era = era
        #: A first contact: initialize carries the ``brmcp/listTools`` mark.
        self.offer = offer
        #: The first contact found a modern bot: dial again in the modern era.
        self.switch = False
        #: Tools a first contact brought (used by the next ``tools/list``).
        self.prefetched: list[Tool] | None = None
        self.session: ClientSession | None = None
        self.error: BaseException | None = None
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self.done = anyio.Event()
        self.users = 0
        self.retired = False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "no answer from the bot"
    return str(exc) or type(exc).__name__
