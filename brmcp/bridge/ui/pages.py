"""Server-rendered HTML of the approvals page. Every value that comes from
a bot or a file (tool names, uids, error texts) is escaped; the page has no
inline script (its Content-Security-Policy forbids one)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from ..approvals import PendingPayment
from ..settings import Settings
from ..spend import DAY_SECONDS, STATUS_FAILED, BotBalance, SpendEntry, SpendSummary

__all__ = ["PageState", "render_fragments", "render_login_needed", "render_notice", "render_page"]

#: Spend entries shown (newest first).
SPEND_ROWS = 50


@dataclass(frozen=True, slots=True)
class PageState:
    """What one rendering shows. ``version`` changes whenever the approvals
    or the spend log change (the script long-polls on it)."""

    settings: Settings
    pending: tuple[PendingPayment, ...]
    spend: SpendSummary
    balances: Mapping[str, BotBalance]
    now: int
    version: int
    #: The command line the page tells you to run (``--datadir`` included when needed).
    command: str = "brmcp-bridge"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _when(ts: int) -> str:
    try:
        return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(ts)


def _uid(uid: str) -> str:
    return f'<code title="{_e(uid)}">{_e(uid[:16])}…</code>' if len(uid) > 16 else f"<code>{_e(uid)}</code>"


def _atoms(atoms: int) -> str:
    return f"{atoms:,}"


def render_approvals(pending: Iterable[PendingPayment], csrf: str, settings: Settings) -> str:
    """The pending approvals: one row per payment, approve and deny buttons."""
    rows = []
    for p in pending:
        forms = "".join(
            f'<form class="decide" method="post" action="/ui/approvals/{_e(p.id)}/{verb}">'
            f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
            f'<button type="submit" class="{verb}" data-id="{_e(p.id)}">{label}</button></form>'
            for verb, label in (("approve", "Approve"), ("deny", "Deny"))
        )
        rows.append(
            f'<tr class="pending" data-id="{_e(p.id)}"><td><code>{_e(p.id)}</code></td><td>{_uid(p.bot)}</td>'
            f"<td>{_e(p.tool)}</td><td class=num>{_atoms(p.atoms)}</td><td>{_when(p.created)}</td>"
            f'<td class="actions">{forms}</td></tr>'
        )
    timeout = f"Each waits {settings.approval_timeout_secs} s, then is refused."
    if not rows:
        note = " Autopay is on: payments within the caps are made without asking." if settings.autopay else ""
        return f'<p class="empty">No payments waiting for approval.{_e(note)}</p>'
    return (
        f"<p>{_e(timeout)}</p><table><thead><tr><th>ID</th><th>Bot</th><th>Tool</th><th>Atoms</th>"
        f"<th>Since (UTC)</th><th></th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _cap_line(label: str, used: int, cap: int) -> str:
    if cap <= 0:
        return f"<li>{_e(label)}: {_atoms(used)} atoms; cap 0 means never pay</li>"
    percent = min(100, used * 100 // cap)
    return (
        f"<li>{_e(label)}: <strong>{_atoms(used)}</strong> of {_atoms(cap)} atoms "
        f'<meter min="0" max="{cap}" value="{min(used, cap)}">{percent}%</meter></li>'
    )


def render_spend(summary: SpendSummary, settings: Settings, now: int) -> str:
    """The rolling 24 h totals against the caps, per bot, and the newest entries."""
    day: dict[str, int] = {}
    for entry in summary.entries:
        if entry.counts and entry.ts >= now - DAY_SECONDS:
            day[entry.bot.lower()] = day.get(entry.bot.lower(), 0) + entry.atoms
    lines = [
        _cap_line("Spent in the last 24 hours", summary.day_total_atoms, settings.per_day_cap_atoms),
        f"<li>Per-call cap: {_atoms(settings.per_call_cap_atoms)} atoms"
        + (" (never pay)" if settings.per_call_cap_atoms <= 0 else "")
        + "</li>",
    ]
    per_bot = "".join(
        f"<tr><td>{_uid(bot)}</td><td class=num>{_atoms(total)}</td></tr>"
        for bot, total in sorted(day.items())
    )
    out = f'<ul class="totals">{"".join(lines)}</ul>'
    if per_bot:
        head = "<thead><tr><th>Bot</th><th>Last 24 h (atoms)</th></tr></thead>"
        out += f"<table>{head}<tbody>{per_bot}</tbody></table>"
    newest: list[SpendEntry] = list(reversed(summary.entries))[:SPEND_ROWS]
    if not newest:
        return out + '<p class="empty">No payments yet.</p>'
    rows = []
    for e in newest:
        status = e.status or "paid"
        detail = f" ({_e(e.err)})" if e.err else ""
        klass = "failed" if status == STATUS_FAILED else _e(status)
        rows.append(
            f'<tr class="{klass}"><td>{_when(e.ts)}</td><td>{_uid(e.bot)}</td><td>{_e(e.tool)}</td>'
            f"<td class=num>{_atoms(e.atoms)}</td><td>{_e(status)}{detail}</td></tr>"
        )
    return (
        out + "<table><thead><tr><th>When (UTC)</th><th>Bot</th><th>Tool</th><th>Atoms</th><th>Status</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render_balances(balances: Mapping[str, BotBalance]) -> str:
    """Per-bot balances as the bots last reported them."""
    if not balances:
        return (
            '<p class="empty">No bot has reported a balance yet (bots report it with each paid result).</p>'
        )
    rows = "".join(
        f"<tr><td>{_uid(bot)}</td><td class=num>{_atoms(b.atoms)}</td><td>{_when(b.ts)}</td></tr>"
        for bot, b in sorted(balances.items())
    )
    return (
        "<table><thead><tr><th>Bot</th><th>Your balance there (atoms)</th><th>Reported (UTC)</th></tr>"
        f"</thead><tbody>{rows}</tbody></table>"
    )


def render_settings(settings: Settings, command: str = "brmcp-bridge") -> str:
    """The settings in force (the agents' token hidden)."""
    bots = settings.allowed_bots or ()
    items = [
        ("enabled", "true" if settings.enabled else "false"),
        ("mode", settings.mode),
        ("per_call_cap_atoms", _atoms(settings.per_call_cap_atoms)),
        ("per_day_cap_atoms", _atoms(settings.per_day_cap_atoms)),
        ("approval_timeout_secs", str(settings.approval_timeout_secs)),
        ("tip_wait_secs", str(settings.tip_wait_secs)),
        ("token", "set (hidden)" if settings.token else "not set"),
    ]
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in items)
    allowed = "".join(f"<li><code>{_e(b)}</code></li>" for b in bots) or "<li>none</li>"
    return (
        f'<table class="settings"><tbody>{rows}<tr><th>allowed_bots</th><td><ul>{allowed}</ul></td></tr>'
        f"</tbody></table><p>Change them with <code>{_e(command)} settings set KEY=VALUE</code>.</p>"
    )


def render_fragments(state: PageState, csrf: str) -> dict[str, object]:
    """The page's live parts by element id, plus ``version`` (the script's
    long-poll JSON)."""
    return {
        "version": state.version,
        "approvals": render_approvals(state.pending, csrf, state.settings),
        "pending_count": len(state.pending),
        "spend": render_spend(state.spend, state.settings, state.now),
        "balances": render_balances(state.balances),
        "settings": render_settings(state.settings, state.command),
    }


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem auto;max-width:70rem;padding:0 1rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%;margin:.5rem 0}th,td{text-align:left;padding:.3rem .5rem;
border-bottom:1px solid #eee;vertical-align:top}td.num{text-align:right;font-variant-numeric:tabular-nums}
form.decide{display:inline;margin-right:.3rem}button{padding:.3rem .9rem;cursor:pointer}
button.approve{background:#1b7f3b;color:#fff;border:0}button.deny{background:#b3261e;color:#fff;border:0}
tr.failed td{color:#b3261e}.empty{color:#666}#status{float:right;color:#666;font-size:.85rem}
meter{width:10rem}.notice{color:#b3261e}.notice:empty{display:none}
"""


def render_page(state: PageState, csrf: str) -> str:
    """The whole page."""
    parts = render_fragments(state, csrf)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta name="brmcp-csrf" content="{_e(csrf)}">'
        f"<title>brmcp bridge: approvals</title><style>{_STYLE}</style></head>"
        f'<body data-version="{state.version}">'
        '<span id="status">static page: reload to update</span>'
        "<h1>brmcp bridge</h1>"
        '<p id="notice" class="notice" role="alert"></p>'
        f'<h2>Waiting for approval (<span id="pending-count">{len(state.pending)}</span>)</h2>'
        f'<section id="approvals">{parts["approvals"]}</section>'
        f'<h2>Spending</h2><section id="spend">{parts["spend"]}</section>'
        f'<h2>Balances at bots</h2><section id="balances">{parts["balances"]}</section>'
        f'<h2>Settings</h2><section id="settings">{parts["settings"]}</section>'
        '<form method="post" action="/ui/logout"><input type="hidden" name="csrf" '
        f'value="{_e(csrf)}"><button type="submit">Log out</button></form>'
        '<script src="/ui/app.js"></script></body></html>'
    )


def render_notice(message: str, back: str) -> str:
    """A page with one message (e.g. a decision refused because the payment
    was withdrawn) and a link back to ``back``."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>brmcp bridge</title>"
        f"<style>{_STYLE}</style></head><body><h1>brmcp bridge</h1>"
        f'<p id="notice" class="notice" role="alert">{_e(message)}</p>'
        f'<p><a href="{_e(back)}">Back to the approvals</a></p></body></html>'
    )


def render_login_needed(reason: str) -> str:
    """The page shown without a session."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>brmcp bridge: log in</title>"
        f"<style>{_STYLE}</style></head><body><h1>brmcp bridge</h1>"
        f'<section id="login-needed"><p>{_e(reason)}</p>'
        "<p>Get a one-time login link with <code>brmcp-bridge ui</code> "
        "(add <code>--datadir DIR</code> if the daemon uses another data directory).</p>"
        "</section></body></html>"
    )
