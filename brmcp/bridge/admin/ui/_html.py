"""The small pieces every section of the approvals page is written with:
escaping, times, uids, bots (with brclient's nick) and amounts. Each value
from a bot, an agent, brclient or a file goes through :func:`esc`."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from datetime import UTC, datetime

__all__ = ["atoms_text", "bot_html", "bot_label", "esc", "time_left", "uid_html", "when_text"]


def esc(value: object) -> str:
    """``value`` as text safe inside HTML and attribute values."""
    return html.escape(str(value), quote=True)


def when_text(ts: float) -> str:
    """Unix seconds ``ts`` as ``YYYY-MM-DD HH:MM:SS`` (UTC); the number itself when out of range."""
    try:
        return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(ts)


def uid_html(uid: str) -> str:
    """A uid as HTML: its first 16 characters, the whole uid in the title."""
    return (
        f'<code title="{esc(uid)}">{esc(uid[:16])}…</code>' if len(uid) > 16 else f"<code>{esc(uid)}</code>"
    )


def bot_html(uid: str, nicks: Mapping[str, str]) -> str:
    """A bot as HTML: its nick when brclient knows one, always its uid."""
    nick = nicks.get(uid.lower())
    if nick is None:
        return uid_html(uid)
    return (
        f'<span class="nick" title="nick from brclient (not an identity)">{esc(nick)}</span> {uid_html(uid)}'
    )


def bot_label(uid: str, nicks: Mapping[str, str]) -> str:
    """A bot as plain text: ``"alice" (1a2b3c4d5e6f7a8b…)``, or the uid
    prefix alone without a nick. Not escaped."""
    prefix = f"{uid[:16]}…" if len(uid) > 16 else uid
    nick = nicks.get(uid.lower())
    return f"“{nick}” ({prefix})" if nick is not None else prefix


def atoms_text(atoms: int) -> str:
    """Atoms with thousands separators (``10,000``)."""
    return f"{atoms:,}"


def time_left(seconds: float) -> str:
    """A countdown as the page prints it: ``1m 58s left``, ``9s left``, or
    ``time is up`` at and after zero (whole seconds, rounded down)."""
    if seconds <= 0:
        return "time is up"
    whole = math.floor(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m {secs:02d}s left" if minutes else f"{secs}s left"
