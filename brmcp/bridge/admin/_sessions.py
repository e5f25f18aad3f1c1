"""One-time login tickets and browser sessions of the approvals page.

A ticket is minted through the admin surface (admin token required) and
printed by ``brmcp-bridge ui`` as a link; opening the link redeems the
ticket once and starts a session, identified by a random cookie value and
bound to its own CSRF token. Everything lives in memory: a restart of the
daemon logs every browser out.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MAX_SESSIONS", "MAX_TICKETS", "SESSION_TTL", "TICKET_TTL", "UISession", "UISessions"]

#: Seconds a login ticket stays valid (it is also single-use).
TICKET_TTL = 300.0
#: Seconds a browser session lasts after its login.
SESSION_TTL = 12 * 3600.0
#: At most this many unredeemed tickets are kept (the oldest is dropped).
MAX_TICKETS = 32
#: At most this many sessions are kept (the oldest is logged out).
MAX_SESSIONS = 32


@dataclass(frozen=True, slots=True)
class UISession:
    """A logged-in browser: ``sid`` (the cookie value), ``csrf`` (sent back
    with every POST) and ``expires`` (monotonic seconds)."""

    sid: str
    csrf: str
    expires: float


class UISessions:
    """Tickets and sessions; ``now`` is a monotonic clock in seconds."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._tickets: OrderedDict[str, float] = OrderedDict()
        self._sessions: OrderedDict[str, UISession] = OrderedDict()

    def mint_ticket(self) -> str:
        """A new single-use ticket (32 hex), valid for :data:`TICKET_TTL` s."""
        self._expire()
        ticket = secrets.token_hex(16)
        self._tickets[ticket] = self._now() + TICKET_TTL
        while len(self._tickets) > MAX_TICKETS:
            self._tickets.popitem(last=False)
        return ticket

    def redeem(self, ticket: str) -> UISession | None:
        """Consume ``ticket`` and start a session; None when the ticket is
        unknown, used or expired."""
        self._expire()
        found = None
        for known in list(self._tickets):
            if hmac.compare_digest(known.encode(), ticket.encode("utf-8", "replace")):
                found = known
        if found is None:
            return None
        del self._tickets[found]
        session = UISession(secrets.token_hex(16), secrets.token_hex(16), self._now() + SESSION_TTL)
        self._sessions[session.sid] = session
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def session(self, sid: str | None) -> UISession | None:
        """The live session with cookie value ``sid``, else None."""
        if not sid:
            return None
        self._expire()
        for known, session in self._sessions.items():
            if hmac.compare_digest(known.encode(), sid.encode("utf-8", "replace")):
                return session
        return None

    def end(self, sid: str) -> None:
        """Log a session out (unknown ids are ignored)."""
        self._sessions.pop(sid, None)

    def _expire(self) -> None:
        now = self._now()
        for ticket, expires in list(self._tickets.items()):
            if expires <= now:
                del self._tickets[ticket]
        for sid, session in list(self._sessions.items()):
            if session.expires <= now:
                del self._sessions[sid]
