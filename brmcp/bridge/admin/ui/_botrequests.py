"""The agents' add-bot requests on the approvals page: their shapes as
``GET /admin/bot-requests`` answers them (read defensively: the page shows
what it can of a malformed row and never fails on one) and their section of
the page, with Approve / Deny forms."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._html import esc, time_left, when_text

__all__ = [
    "BOT_REQUEST_ROWS",
    "MAX_REQUEST_TEXT",
    "BotRequest",
    "BotRequests",
    "EndedBotRequest",
    "bot_request_text",
    "bot_requests_from_json",
    "render_bot_requests",
]


#: Characters of an agent's reason (and of other request texts) shown at most.
MAX_REQUEST_TEXT = 300
#: Add-bot requests shown at most, pending and recent each.
BOT_REQUEST_ROWS = 20


def _cut(value: object, limit: int = MAX_REQUEST_TEXT) -> str:
    """``value`` as printable text of at most ``limit`` characters (``…`` marks a cut)."""
    text = "".join(ch for ch in str(value) if ch.isprintable())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text_of(value: object) -> str | None:
    return None if value is None else _cut(value)


def _time_of(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass(frozen=True, slots=True)
class BotRequest:
    """One agent's request to add a bot, parked for the user (an entry of
    ``pending`` in ``GET /admin/bot-requests``): ``uid`` the bot, ``reason``
    the agent's words (untrusted text), ``via`` the directory named (or
    None), ``agent`` who asked, ``requested_at``/``expires_at`` unix
    seconds (None: not given), ``contact`` whether the bot is a contact of
    brclient (None: not known)."""

    id: str
    uid: str
    reason: str
    via: str | None
    agent: str | None
    requested_at: float | None
    expires_at: float | None
    contact: bool | None


@dataclass(frozen=True, slots=True)
class EndedBotRequest:
    """An add-bot request that ended (``recent`` in ``GET /admin/bot-requests``)."""

    id: str
    uid: str
    outcome: str
    ended_at: float | None


@dataclass(frozen=True, slots=True)
class BotRequests:
    """What ``GET /admin/bot-requests`` answered, bounded to
    :data:`BOT_REQUEST_ROWS` rows each and with every text cut to
    :data:`MAX_REQUEST_TEXT` printable characters."""

    pending: tuple[BotRequest, ...] = ()
    recent: tuple[EndedBotRequest, ...] = ()


def bot_requests_from_json(value: object) -> BotRequests | None:
    """The add-bot requests of a ``GET /admin/bot-requests`` answer
    (``{"pending": [{"id", "uid", "reason", "via", "agent", "requestedAt",
    "expiresAt", "contact"}…], "recent": [{"id", "uid", "outcome",
    "endedAt"}…]}``); None when it is not such an object. Rows without a
    string ``id`` and ``uid`` are left out; every other field is optional."""
    if not isinstance(value, dict):
        return None
    pending_raw, recent_raw = value.get("pending"), value.get("recent", [])
    if not isinstance(pending_raw, list) or not isinstance(recent_raw, list):
        return None
    pending: list[BotRequest] = []
    for row in pending_raw[:BOT_REQUEST_ROWS]:
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("id"), str)
            or not isinstance(row.get("uid"), str)
        ):
            continue
        contact = row.get("contact")
        pending.append(
            BotRequest(
                id=_cut(row["id"], 80),
                uid=_cut(row["uid"], 80),
                reason=_cut(row.get("reason") or ""),
                via=_text_of(row.get("via")),
                agent=_text_of(row.get("agent")),
                requested_at=_time_of(row.get("requestedAt")),
                expires_at=_time_of(row.get("expiresAt")),
                contact=contact if isinstance(contact, bool) else None,
            )
        )
    recent: list[EndedBotRequest] = []
    for row in recent_raw[:BOT_REQUEST_ROWS]:
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("id"), str)
            or not isinstance(row.get("uid"), str)
        ):
            continue
        recent.append(
            EndedBotRequest(
                id=_cut(row["id"], 80),
                uid=_cut(row["uid"], 80),
                outcome=_cut(row.get("outcome") or "ended", 80),
                ended_at=_time_of(row.get("endedAt")),
            )
        )
    return BotRequests(tuple(pending), tuple(recent))


def bot_request_text(request: BotRequest) -> str:
    """The line a pending request is shown with, as plain text (not
    escaped): ``An agent asks to add bot <full uid>: <reason>``."""
    return f"An agent asks to add bot {request.uid}: {request.reason or '(no reason given)'}"


def render_bot_requests(
    requests: BotRequests | None, csrf: str, now: float = 0.0, nicks: Mapping[str, str] | None = None
) -> str:
    """The agents' add-bot requests: each pending one as ``An agent asks to
    add bot <uid>: <reason>`` with who asked, through which directory,
    whether the bot is a contact, when it expires, and Approve / Deny
    forms (``POST /ui/bot-requests/<id>/approve`` or ``…/deny``); then the
    ones that ended lately. Empty (nothing shown) when the bridge has no
    such requests (``requests`` None: ``/admin/bot-requests`` is not
    served)."""
    if requests is None:
        return ""
    names = nicks or {}
    rows = []
    for r in requests.pending:
        forms = "".join(
            f'<form class="decide" method="post" action="/ui/bot-requests/{esc(r.id)}/{verb}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<button type="submit" class="{verb}" data-request="{esc(r.id)}">{label}</button></form>'
            for verb, label in (("approve", "Approve"), ("deny", "Deny"))
        )
        nick = names.get(r.uid.lower())
        details = [f"request <code>{esc(r.id)}</code>"]
        if r.agent:
            details.append(f"from agent {esc(r.agent)}")
        if r.via:
            details.append(f"via directory <code>{esc(r.via)}</code>")
        if nick is not None:
            details.append(f'brclient nick <span class="nick">{esc(nick)}</span> (a label, not an identity)')
        if r.contact is None:
            details.append("contact not known")
        else:
            details.append(
                "a contact of your brclient"
                if r.contact
                else "not a contact yet (a key exchange comes first)"
            )
        if r.requested_at is not None:
            details.append(f"asked at {when_text(r.requested_at)} UTC")
        if r.expires_at is not None:
            details.append(f"expires at {when_text(r.expires_at)} UTC ({esc(time_left(r.expires_at - now))})")
        rows.append(
            f'<li class="bot-request" data-request="{esc(r.id)}">'
            f'<span class="ask">{esc(bot_request_text(r))}</span>'
            f'<br><small>{"; ".join(details)}</small><div class="actions">{forms}</div></li>'
        )
    out = "<h2>Add-bot requests from agents</h2>"
    if rows:
        out += (
            "<p>Approving puts the bot on allowed_bots under your caps; an agent can only ask.</p>"
            f'<ul class="bot-requests">{"".join(rows)}</ul>'
        )
    else:
        out += '<p class="empty">No agent asks to add a bot.</p>'
    ended = "".join(
        f'<li class="{esc(e.outcome)}">Bot <code>{esc(e.uid)}</code>: {esc(e.outcome)}'
        + (f" <small>({when_text(e.ended_at)} UTC)</small>" if e.ended_at is not None else "")
        + "</li>"
        for e in requests.recent
    )
    if ended:
        out += f'<ul class="bot-requests-recent">{ended}</ul>'
    return out
