"""A reply to humans who send a bot plain chat: how to reach it from an agent.

A bot speaks MCP inside brmcp envelopes; a person who opens a DM with it and
types "hi" would otherwise get nothing back. :class:`ChatHelp` decides when
to answer such a PM and with what, as the Go reference's directory bot
does (karamble/brmcp ``cmd/brmcpdir``, its plain-chat orientation reply):

* only plain chat: the caller hands it PMs that are **not** envelopes nor
  batches (:func:`brmcp.wire.is_envelope`, :func:`brmcp.wire.is_batch`), so
  an MCP message is never answered with chat;
* at most once per sender per :data:`REPLY_INTERVAL` (an hour), so two
  auto-responders cannot ping-pong;
* bounded memory: the last :data:`MAX_SENDERS` senders are remembered
  (least recently answered dropped first; a dropped sender may get the
  reply again within the hour);
* only once the bot knows its own uid (the text names it).

The default text (:data:`DEFAULT_TEXT`) says what the bot is and gives the
``brmcp-bridge`` commands that let an agent call it; a sender the bot's
allowlist does not admit is also told to ask the operator (their uid is
named). An operator can replace the text or turn the reply off
(``chat_help`` in brmcp-serve's ``brmcp.json``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = [
    "BRIDGE_PORT",
    "DEFAULT_TEXT",
    "MAX_SENDERS",
    "NOT_ALLOWED_TEXT",
    "REPLY_INTERVAL",
    "ChatHelp",
    "render",
]

#: Seconds between two replies to the same sender (the Go reference: one hour).
REPLY_INTERVAL = 3600.0
#: Senders remembered for the throttle.
MAX_SENDERS = 10_000
#: The bridge's conventional port (the Go reference's help text uses 8891).
BRIDGE_PORT = 8891

#: The built-in reply. ``{bot_uid}``, ``{bot_nick}`` and ``{sender_uid}`` are
#: filled in; ``{access}`` becomes :data:`NOT_ALLOWED_TEXT` for a sender the
#: allowlist does not admit, else nothing.
DEFAULT_TEXT = """\
Hi, I am {bot_nick}, a Bison Relay bot that serves MCP tools to AI agents. I do not read chat; \
connect an agent to use my tools.

With brmcp's bridge (pip install brmcp) next to your own brclient:
1. Allow me as a bot (add my uid to any you already allow, comma-separated):
   brmcp-bridge settings set enabled=true allowed_bots={bot_uid}
2. Start the bridge: brmcp-bridge
3. Print the configuration for your agent and paste it there:
   brmcp-bridge config-snippet {bot_uid}

The agent's endpoint is http://127.0.0.1:{bridge_port}/mcp/{bot_uid}, authorized with your bridge \
token. Paid tools are paid with tips, within the caps you set (per_call_cap_atoms, \
per_day_cap_atoms).{access}

(This reply comes at most once an hour.)"""

#: Appended to the default text for a sender the bot's allowlist does not admit.
NOT_ALLOWED_TEXT = (
    "\n\nNote: this bot answers only the callers its operator allows, and your uid ({sender_uid}) "
    "is not among them yet: ask the operator to add it."
)


def render(template: str, *, bot_uid: str, bot_nick: str, sender_uid: str, allowed: bool) -> str:
    """``template`` with ``{bot_uid}``, ``{bot_nick}`` (the uid's first 16
    digits when the nick is empty), ``{sender_uid}``, ``{bridge_port}`` and
    ``{access}`` replaced (plain substitution: other braces, e.g. JSON in
    an operator's text, are kept as written)."""
    access = "" if allowed else NOT_ALLOWED_TEXT
    values = {
        "{access}": access,
        "{bot_uid}": bot_uid,
        "{bot_nick}": bot_nick or bot_uid[:16],
        "{sender_uid}": sender_uid,
        "{bridge_port}": str(BRIDGE_PORT),
    }
    out = template
    for token, value in values.items():
        out = out.replace(token, value)
    return out


class ChatHelp:
    """The once-per-sender-per-hour throttle of the plain-chat reply.

    ``interval`` is in seconds (default :data:`REPLY_INTERVAL`); at most
    ``max_senders`` (default :data:`MAX_SENDERS`) are remembered; ``clock``
    returns seconds (default :func:`time.monotonic`). Raises ValueError for
    an ``interval`` < 0 or a ``max_senders`` < 1. Not thread-safe (one event
    loop)."""

    def __init__(
        self,
        *,
        interval: float = REPLY_INTERVAL,
        max_senders: int = MAX_SENDERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval}")
        if max_senders < 1:
            raise ValueError(f"max_senders must be >= 1, got {max_senders}")
        self.interval = interval
        self.max_senders = max_senders
        self._clock = clock
        self._last: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        """Senders remembered now (at most ``max_senders``)."""
        return len(self._last)

    def should_reply(self, sender: str) -> bool:
        """True when ``sender`` (a uid; case-insensitive) has not been
        answered within ``interval``; it is then recorded as answered now
        (so call this only when the reply is about to be sent)."""
        key = sender.lower()
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        while len(self._last) > self.max_senders:
            self._last.popitem(last=False)
        return True

    def forget(self, sender: str) -> None:
        """Drop ``sender`` from the throttle (a reply that could not be sent
        may be tried again on its next message)."""
        self._last.pop(sender.lower(), None)
