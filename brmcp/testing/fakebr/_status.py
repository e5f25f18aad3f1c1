"""The status server of a fake brclientd: ``POST /contacts/suggest-kx`` over
the clientrpc mutual TLS, which has the user's client send a KX suggestion
(the client library's ``SuggestKX``; karamble/brmcp,
``cmd/brmcpdir/main.go``, is the caller this models; docs/clientrpc.md §KX
suggestions).

brclientd's own sources are not public, so its refusal codes are the
fake's choice, documented here: 204 on success; 405 for a method other
than POST; 404 (Go's ``404 page not found``) for any other path; 400 for a
body that is not ``{"invitee": "<hex>", "target": "<hex>"}`` or a uid that
does not parse (Go's hex and ``invalid ShortID length: N`` texts); 404
``user <uid> not found`` when the invitee or the target is not a contact
(``SuggestKX`` looks both up among the contacts). Tests queue other answers
with :meth:`StatusServer.fail_next`.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable

from aiohttp import web

from ._handlers import go_hex_decode
from ._protocol import RPCFault, http_error
from ._state import Changes, Settings
from .relay import FakeRelay

__all__ = ["SUGGEST_KX_PATH", "StatusServer"]

log = logging.getLogger("brmcp.testing.fakebr")

SUGGEST_KX_PATH = "/contacts/suggest-kx"
#: Largest request body read (a suggestion is about 150 bytes).
_MAX_BODY = 64 << 10


class StatusServer:
    """The aiohttp handlers of one fake's status server.

    ``settings``: the user (its uid, read per request); ``relay``: contacts
    and the suggestion's delivery; ``changes``: signalled on every request;
    ``on_request``: called with ``(status, body)`` of each answer (the
    fake's record).
    """

    def __init__(
        self,
        settings: Settings,
        relay: FakeRelay,
        changes: Changes,
        on_request: Callable[[int, dict[str, str] | None], None],
    ) -> None:
        self._settings = settings
        self._relay = relay
        self._changes = changes
        self._on_request = on_request
        self._faults: deque[tuple[int, str]] = deque()

    def routes(self, app: web.Application) -> None:
        """Add the suggestion endpoint and Go's 404 for every other path."""
        app.router.add_route("*", SUGGEST_KX_PATH, self._suggest)
        app.router.add_route("*", "/{tail:.*}", self._not_found)

    def fail_next(self, status: int, body: str) -> None:
        """Answer the next suggestion request with ``status`` and ``body``
        (text) instead of handling it; calls queue up in order."""
        self._faults.append((status, body))

    async def _not_found(self, request: web.Request) -> web.Response:
        return http_error(404, "404 page not found")

    async def _suggest(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            return http_error(405, "method not allowed")
        raw = await request.content.read(_MAX_BODY)
        if self._faults:
            status, text = self._faults.popleft()
            self._answered(status, None)
            return http_error(status, text)
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return self._refuse(400, f"invalid request body: {exc}", None)
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("invitee"), str)
            or not isinstance(body.get("target"), str)
        ):
            return self._refuse(
                400, 'invalid request body: want {"invitee": "<hex>", "target": "<hex>"}', None
            )
        fields = {"invitee": body["invitee"], "target": body["target"]}
        try:
            invitee, target = _short_id(fields["invitee"]), _short_id(fields["target"])
        except RPCFault as fault:
            return self._refuse(400, fault.message, fields)
        me = self._settings.uid
        for uid in (invitee, target):
            if not self._relay.are_contacts(me, uid):
                return self._refuse(404, f"user {uid} not found", fields)
        self._relay.start_suggest_kx(me, invitee, target)
        self._answered(204, fields)
        return web.Response(status=204)

    def _refuse(self, status: int, text: str, fields: dict[str, str] | None) -> web.Response:
        log.info("fakebr: %s status server refused a suggestion: %d %s", self._settings.nick, status, text)
        self._answered(status, fields)
        return http_error(status, text)

    def _answered(self, status: int, fields: dict[str, str] | None) -> None:
        self._on_request(status, fields)
        self._changes.changed()


def _short_id(text: str) -> str:
    """zkidentity's ``ShortID.FromString``: Go hex, then exactly 32 bytes."""
    raw = go_hex_decode(text)
    if len(raw) != 32:
        raise RPCFault(0, f"invalid ShortID length: {len(raw)}")
    return raw.hex()
