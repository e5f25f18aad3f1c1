"""Push status for registrations (docs/directory.md §Push status): the
directory serves each caller's own registration status as the MCP resource
:data:`STATUS_URI` and sends ``notifications/resources/updated`` to that
caller's subscribed sessions whenever the registration changes, so a
provider subscribes instead of polling ``my_status``.

Directory side, :class:`StatusPush`:

* ``resources/read`` of :data:`STATUS_URI` answers the caller's
  ``my_status`` JSON (``StatusOut``: ``{state, requiredAtoms, balanceAtoms,
  shortfallAtoms, feeAtoms, testBudgetAtoms, expiresAt, note}``, Go's
  ``omitempty``); a caller with no registration or listing reads
  ``{"state": "none", "note": NOT_REGISTERED_NOTE}``. A caller only ever
  reads its own: the uid is the session's, no argument names one.
* :meth:`StatusPush.changed` is called after each committed state change of
  a uid's registration. It never blocks and never touches the database: a
  uid without a subscribed session costs one lookup; otherwise one delivery
  task per uid sends the notification to that uid's subscribed sessions
  only. Changes arriving while a delivery is under way coalesce into one
  more notification, so a uid has at most one notification in flight and
  one pending, whatever the rate of changes.
* ``register`` and ``my_status`` answers carry the hint
  ``_meta[STATUS_RESOURCE_KEY] = STATUS_URI`` (:data:`STATUS_HINT`); a Go
  directory sends neither the hint nor the resource.

Provider side: :func:`announced` reads the hint from a tool result,
:func:`status_from_read` decodes a read of the resource, and
:func:`settled` says when following a registration can stop; the
:class:`~.registrant.Registrant` uses them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.abc
import mcp.types as types

from brmcp.server import Harness, PeerContext

from ._types import (
    STATE_AWAITING_FUNDING,
    STATE_CRAWLING,
    STATE_NONE,
    STATE_PENDING_REVIEW,
    STATE_TESTING,
    ShapeError,
    StatusOut,
)

__all__ = [
    "MAX_STATUS_CHARS",
    "NOT_REGISTERED_NOTE",
    "STATUS_HINT",
    "STATUS_RESOURCE_KEY",
    "STATUS_URI",
    "StatusPush",
    "announced",
    "settled",
    "status_from_read",
]

log = logging.getLogger("brmcp.directory")

#: The per-caller registration status resource.
STATUS_URI = "brmcpdir://registration"
#: The ``_meta`` key of ``register``/``my_status`` answers naming :data:`STATUS_URI`.
STATUS_RESOURCE_KEY = "brmcp/statusResource"
#: The note of a read by a caller the directory knows nothing about.
NOT_REGISTERED_NOTE = "not registered at this directory; call register"
#: The result ``_meta`` of ``register`` and ``my_status`` answers (declared by
#: the directory with ``Harness.set_result_meta``: tool output cannot carry
#: ``brmcp/`` keys).
STATUS_HINT: dict[str, Any] = {STATUS_RESOURCE_KEY: STATUS_URI}
#: Longest status text a provider decodes from a read, in characters.
MAX_STATUS_CHARS = 64 * 1024

#: ``notify(uri, peer)``: send ``notifications/resources/updated`` for
#: ``uri`` to ``peer``'s subscribed sessions; returns how many were sent.
Notifier = Callable[[str, str], Awaitable[int]]
#: ``subscribers(uri, peer)``: how many of ``peer``'s sessions subscribed to ``uri``.
Counter = Callable[[str, str], int]


class StatusPush:
    """The directory's status resource and its notifications.

    ``status(uid)`` is ``my_status`` for ``uid`` (the pipeline's). By default
    notifications go through ``harness``; ``notify`` and ``subscribers``
    replace that path (a host with its own sessions). Call :meth:`install`
    once to add the resource, :meth:`bind` with the directory's task group
    while it serves; :meth:`changed` is then the one hook of every state
    change."""

    def __init__(
        self,
        harness: Harness,
        status: Callable[[str], Awaitable[StatusOut]],
        *,
        notify: Notifier | None = None,
        subscribers: Counter | None = None,
    ) -> None:
        self._harness = harness
        self._status = status
        self._notify: Notifier = notify or self._harness_notify
        self._subscribers: Counter = subscribers or self._harness_subscribers
        self._tg: anyio.abc.TaskGroup | None = None
        self._dirty: set[str] = set()
        self._delivering: set[str] = set()
        #: Notifications handed to the notifier that reached a session.
        self.sent = 0

    async def _harness_notify(self, uri: str, peer: str) -> int:
        return await self._harness.notify_resource_updated(uri, peer=peer)

    def _harness_subscribers(self, uri: str, peer: str) -> int:
        return self._harness.resource_subscribers(uri, peer=peer)

    def install(self) -> None:
        """Add the resource :data:`STATUS_URI` to the harness (its sessions
        then declare ``resources: {subscribe, listChanged}``). Raises
        ValueError when the harness has it already."""
        self._harness.add_resource(
            STATUS_URI,
            self.read,
            name="registration",
            title="Your registration",
            description=(
                "The calling bot's registration or listing state, as my_status answers it; "
                "subscribe to be told of every change."
            ),
            mime_type="application/json",
        )

    def bind(self, tg: anyio.abc.TaskGroup | None) -> None:
        """Deliver in ``tg`` from now on (None: drop changes; nothing is
        subscribed to a directory that does not serve)."""
        self._tg = tg
        if tg is None:
            self._dirty.clear()

    async def read(self, ctx: PeerContext) -> dict[str, Any]:
        """The resource for ``ctx.peer``: its ``my_status`` JSON, or
        ``{"state": "none", "note": NOT_REGISTERED_NOTE}``."""
        out = (await self._status(ctx.peer)).to_json()
        if out.get("state") == STATE_NONE and not out.get("note"):
            out["note"] = NOT_REGISTERED_NOTE
        return out

    @property
    def pending(self) -> int:
        """Uids with a notification waiting behind one in flight."""
        return len(self._dirty)

    @property
    def delivering(self) -> int:
        """Uids with a delivery task running (at most one each)."""
        return len(self._delivering)

    def changed(self, uid: str) -> None:
        """``uid``'s registration changed (called after the commit). Returns
        at once; the notification goes out on the directory's task group to
        ``uid``'s subscribed sessions only, coalesced with any change still
        waiting for it."""
        tg = self._tg
        if tg is None or self._subscribers(STATUS_URI, uid) == 0:
            return
        self._dirty.add(uid)
        if uid not in self._delivering:
            self._delivering.add(uid)
            tg.start_soon(self._deliver, uid, name=f"brmcpdir-status-{uid[:8]}")

    async def _deliver(self, uid: str) -> None:
        try:
            while uid in self._dirty:
                self._dirty.discard(uid)
                try:
                    self.sent += await self._notify(STATUS_URI, uid)
                except Exception as exc:
                    log.debug("status update for %s not delivered: %s", uid[:8], exc)
        finally:
            self._dirty.discard(uid)
            self._delivering.discard(uid)


def announced(result: types.CallToolResult) -> bool:
    """Whether a directory's answer carries the push-status hint."""
    meta = result.meta
    return isinstance(meta, dict) and meta.get(STATUS_RESOURCE_KEY) == STATUS_URI


def status_from_read(result: Any) -> StatusOut:
    """Decode a ``resources/read`` answer of :data:`STATUS_URI`: its first
    text item, at most :data:`MAX_STATUS_CHARS` characters, as a
    ``StatusOut``. Raises ValueError naming what is wrong."""
    contents = getattr(result, "contents", None)
    if not isinstance(contents, list) or not contents:
        raise ValueError("the status resource answer has no contents")
    first = contents[0]
    if not isinstance(first, types.TextResourceContents):
        raise ValueError("the status resource answer is not text")
    if len(first.text) > MAX_STATUS_CHARS:
        raise ValueError(f"the status resource answer is longer than {MAX_STATUS_CHARS} characters")
    try:
        return StatusOut.from_json(json.loads(first.text))
    except (ValueError, ShapeError) as exc:
        raise ValueError(f"the status resource is not a status: {exc}") from None


def settled(status: StatusOut) -> bool:
    """Whether ``status`` is an outcome that moves only by an operator or a
    new ``register``: ``listed``, ``rejected``, ``none``, or parked in
    ``pending_review`` with a failure note. A verified application awaiting
    review (``pending_review`` without a note), ``awaiting_funding``,
    ``crawling`` and ``testing`` are still under way; an unknown state
    counts as settled (nothing to wait for)."""
    if status.state == STATE_PENDING_REVIEW:
        return bool(status.note)
    return status.state not in _UNDER_WAY


_UNDER_WAY = frozenset({STATE_AWAITING_FUNDING, STATE_CRAWLING, STATE_TESTING})
