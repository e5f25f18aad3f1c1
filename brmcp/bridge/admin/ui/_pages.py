"""Server-rendered HTML of the approvals page. Every value that comes from
a bot, an agent, brclient or a file (tool names, call arguments, nicks,
uids, error texts) is escaped; the page has no inline script (its
Content-Security-Policy forbids one)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from brmcp._ops.clock import go_duration
from brmcp.bridge.base import (
    DEFAULT_APPROVAL_TIMEOUT_SECS,
    DEFAULT_TIP_WAIT_SECS,
    MIN_TOKEN_CHARS,
    MODE_APPROVAL,
    MODE_AUTOPAY,
    Settings,
)
from brmcp.bridge.pay import (
    DAY_SECONDS,
    STATUS_FAILED,
    STATUS_PAID,
    BotBalance,
    EndedPayment,
    PendingPayment,
    SpendEntry,
    SpendSummary,
)

from ._botrequests import BotRequests, render_bot_requests
from ._html import atoms_text, bot_html, bot_label, esc, time_left, when_text

__all__ = [
    "RECENT_ROWS",
    "RECENT_SECS",
    "SPEND_ROWS",
    "PageState",
    "approved_outcome",
    "caps_of",
    "decision_text",
    "render_find",
    "render_fragments",
    "render_login_needed",
    "render_notice",
    "render_page",
]

#: Spend entries shown (newest first).
SPEND_ROWS = 50
#: Seconds an ended payment stays in "Recent decisions".
RECENT_SECS = 600
#: Ended payments shown at most in "Recent decisions" (newest first).
RECENT_ROWS = 10


@dataclass(frozen=True, slots=True)
class PageState:
    """What one rendering shows. ``version`` changes whenever the approvals
    or the spend log change (the script long-polls on it); ``now`` is the
    bridge clock (unix seconds); ``nicks``: brclient's nicks by lowercase
    uid (bots without one are shown by uid only); ``recent``: payments
    that ended lately, newest first; ``settings_file``: the path of
    ``mcpclient.json`` (None: not known); ``bot_requests``: the agents'
    add-bot requests (None: ``/admin/bot-requests`` is not served)."""

    settings: Settings
    pending: tuple[PendingPayment, ...]
    spend: SpendSummary
    balances: Mapping[str, BotBalance]
    now: float
    version: int
    #: The command line the page tells you to run (``--datadir`` included when needed).
    command: str = "brmcp-bridge"
    nicks: Mapping[str, str] = field(default_factory=dict)
    recent: tuple[EndedPayment, ...] = ()
    settings_file: str | None = None
    #: The agents' add-bot requests (None: the bridge serves none).
    bot_requests: BotRequests | None = None


_OUTCOME_LABEL = {
    "approved": "Approved",
    "denied": "Denied",
    "timeout": "Timed out",
    "withdrawn": "Withdrawn",
}


def decision_text(ended: EndedPayment, nicks: Mapping[str, str]) -> str:
    """How a payment ended, in one line of plain text (not escaped), e.g.
    ``Approved: 500 atoms to "alice" (1a2b3c4d5e6f7a8b…) for tool paid; paid``.
    An approved payment says what became of it, from the spend log
    (:func:`approved_outcome`)."""
    p = ended.payment
    label = _OUTCOME_LABEL[ended.outcome]
    what = f"{label}: {atoms_text(p.atoms)} atoms to {bot_label(p.bot, nicks)} for tool {p.tool}"
    if ended.outcome == "approved":
        return f"{what}; {approved_outcome(ended)}"
    if ended.outcome == "denied":
        return f"{what}; nothing was paid"
    if ended.outcome == "timeout":
        return f"{what}: no decision within {go_duration(ended.timeout_secs)}, so nothing was paid"
    return f"{what}: the agent went away, so nothing was paid"


def approved_outcome(ended: EndedPayment) -> str:
    """What became of an approved payment, from its spend entry: ``the
    payment is being made (see Spending)``, ``paid``, ``the payment failed:
    <error>; nothing was paid``, ``its outcome is not known yet (<why>); it
    stays pending, and counted, in Spending until brclient reports it``, or
    ``not paid: <reason>`` when it was not made after all."""
    if ended.not_paid is not None:
        return f"not paid: {ended.not_paid}"
    spend = ended.spend
    if spend is None or ended.paying:
        return "the payment is being made (see Spending)"
    if spend.status == STATUS_PAID:
        return f"paid ({spend.err})" if spend.err else "paid"
    if spend.status == STATUS_FAILED:
        return f"the payment failed: {spend.err or 'no reason given'}; nothing was paid"
    why = spend.err or "brclient has not reported it"
    return (
        f"its outcome is not known yet ({why}); it stays pending, and counted, in Spending until "
        "brclient reports it"
    )


def _decision_class(ended: EndedPayment) -> str:
    """The ``<li>`` class of a decision: its outcome, and for an approved
    payment what became of it (``paid``, ``failed``, ``pending``, ``paying``,
    ``not-paid``)."""
    if ended.outcome != "approved":
        return ended.outcome
    if ended.not_paid is not None:
        return "approved not-paid"
    spend = ended.spend
    if spend is None or ended.paying:
        return "approved paying"
    return f"approved {spend.status or STATUS_PAID}"


def _arguments(p: PendingPayment, inline: bool) -> str:
    if p.arguments is None:
        return '<p class="noargs">No call arguments (a prepayment, or not known).</p>'
    body = esc(p.arguments) if inline else ""
    return f'<pre class="args" data-args-for="{esc(p.id)}">{body}</pre>'


def _countdown(p: PendingPayment, now: float) -> str:
    if p.expires is None:
        return "—"
    left = p.expires - now
    urgent = " urgent" if left < 30 else ""
    return (
        f'<span class="countdown{urgent}" data-remaining="{max(left, 0.0):.1f}">{esc(time_left(left))}</span>'
        f'<br><small class="expires">refused at {when_text(p.expires)} UTC</small>'
    )


def render_approvals(
    pending: Iterable[PendingPayment],
    csrf: str,
    settings: Settings,
    now: float = 0.0,
    nicks: Mapping[str, str] | None = None,
    *,
    inline_args: bool = True,
) -> str:
    """The pending approvals: one row per payment with the bot (nick and
    uid), the tool and its call's arguments, the atoms, the time left and
    the approve and deny buttons. ``inline_args`` False leaves the
    arguments' ``<pre data-args-for=ID>`` empty for the script to fill as
    text (the live JSON carries them apart from the HTML)."""
    names = nicks or {}
    rows = []
    for p in pending:
        forms = "".join(
            f'<form class="decide" method="post" action="/ui/approvals/{esc(p.id)}/{verb}">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<button type="submit" class="{verb}" data-id="{esc(p.id)}">{label}</button></form>'
            for verb, label in (("approve", "Approve"), ("deny", "Deny"))
        )
        rows.append(
            f'<tr class="pending" data-id="{esc(p.id)}"><td class="bot">{bot_html(p.bot, names)}</td>'
            f'<td><span class="tool">{esc(p.tool)}</span>{_arguments(p, inline_args)}</td>'
            f"<td class=num>{atoms_text(p.atoms)}</td>"
            f'<td class="left">{_countdown(p, now)}</td>'
            f"<td>{when_text(p.created)}<br><small>ID <code>{esc(p.id)}</code></small></td>"
            f'<td class="actions">{forms}</td></tr>'
        )
    if not rows:
        note = " Autopay is on: payments within the caps are made without asking." if settings.autopay else ""
        return f'<p class="empty">No payments waiting for approval.{esc(note)}</p>'
    timeout = (
        "Each payment waits for your decision until its time is up (approval_timeout_secs, now "
        f"{settings.approval_timeout_secs} s), then is refused and nothing is paid."
    )
    return (
        f"<p>{esc(timeout)}</p><table><thead><tr><th>Bot</th><th>Tool and call arguments</th><th>Atoms</th>"
        f"<th>Time left</th><th>Since (UTC)</th><th></th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render_decisions(recent: Iterable[EndedPayment], nicks: Mapping[str, str] | None = None) -> str:
    """The payments that ended lately (decided on this page, through the
    CLI or the admin API, timed out or withdrawn), newest first."""
    names = nicks or {}
    items = "".join(
        f'<li class="{esc(_decision_class(ended))}">{esc(decision_text(ended, names))} '
        f"<small>({when_text(ended.ended)} UTC)</small></li>"
        for ended in recent
    )
    if not items:
        return f'<p class="empty">No payment ended in the last {RECENT_SECS // 60} minutes.</p>'
    return f'<ul class="decisions">{items}</ul>'


def _cap_line(label: str, used: int, cap: int) -> str:
    if cap <= 0:
        return f"<li>{esc(label)}: {atoms_text(used)} atoms; cap 0 means never pay</li>"
    percent = min(100, used * 100 // cap)
    return (
        f"<li>{esc(label)}: <strong>{atoms_text(used)}</strong> of {atoms_text(cap)} atoms "
        f'<meter min="0" max="{cap}" value="{min(used, cap)}">{percent}%</meter></li>'
    )


def render_spend(
    summary: SpendSummary, settings: Settings, now: float, nicks: Mapping[str, str] | None = None
) -> str:
    """The rolling 24 h totals against the caps, per bot, and the newest entries."""
    names = nicks or {}
    day: dict[str, int] = {}
    for entry in summary.entries:
        if entry.counts and entry.ts >= now - DAY_SECONDS:
            day[entry.bot.lower()] = day.get(entry.bot.lower(), 0) + entry.atoms
    lines = [
        _cap_line("Spent in the last 24 hours", summary.day_total_atoms, settings.per_day_cap_atoms),
        f"<li>Per-call cap: {atoms_text(settings.per_call_cap_atoms)} atoms"
        + (" (never pay)" if settings.per_call_cap_atoms <= 0 else "")
        + "</li>",
    ]
    per_bot = "".join(
        f"<tr><td>{bot_html(bot, names)}</td><td class=num>{atoms_text(total)}</td></tr>"
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
        detail = f" ({esc(e.err)})" if e.err else ""
        klass = "failed" if status == STATUS_FAILED else esc(status)
        rows.append(
            f'<tr class="{klass}"><td>{when_text(e.ts)}</td><td>{bot_html(e.bot, names)}</td>'
            f"<td>{esc(e.tool)}</td>"
            f"<td class=num>{atoms_text(e.atoms)}</td><td>{esc(status)}{detail}</td></tr>"
        )
    return (
        out + "<table><thead><tr><th>When (UTC)</th><th>Bot</th><th>Tool</th><th>Atoms</th><th>Status</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render_balances(balances: Mapping[str, BotBalance], nicks: Mapping[str, str] | None = None) -> str:
    """Per-bot balances as the bots last reported them."""
    names = nicks or {}
    if not balances:
        return (
            '<p class="empty">No bot has reported a balance yet (bots report it with each paid result).</p>'
        )
    rows = "".join(
        f"<tr><td>{bot_html(bot, names)}</td><td class=num>{atoms_text(b.atoms)}</td>"
        f"<td>{when_text(b.ts)}</td></tr>"
        for bot, b in sorted(balances.items())
    )
    return (
        "<table><thead><tr><th>Bot</th><th>Your balance there (atoms)</th><th>Reported (UTC)</th></tr>"
        f"</thead><tbody>{rows}</tbody></table>"
    )


def _set(command: str, assignment: str) -> str:
    return f"<code>{esc(command)} settings set {esc(assignment)}</code>"


def _how_to_change(key: str, settings: Settings, command: str) -> str:
    """How to change one setting, as HTML (the CLI's ``settings set`` keys)."""
    if key == "enabled":
        return (
            f"{_set(command, 'enabled=false')}: stops the agents' endpoint, and this page with it "
            f"(turn it back on with {_set(command, 'enabled=true')})"
        )
    if key == "mode":
        other = MODE_AUTOPAY if settings.mode == MODE_APPROVAL else MODE_APPROVAL
        return (
            f"{_set(command, f'mode={other}')}: <em>approval</em> parks each payment here for you; "
            "<em>autopay</em> pays within the caps without asking"
        )
    if key == "per_call_cap_atoms":
        return f"{_set(command, 'per_call_cap_atoms=N')}: atoms; 0 or less means never pay"
    if key == "per_day_cap_atoms":
        return (
            f"{_set(command, 'per_day_cap_atoms=N')}: atoms in a rolling 24 hours; 0 or less means never pay"
        )
    if key == "approval_timeout_secs":
        return (
            f"{_set(command, 'approval_timeout_secs=N')}: seconds; 0 or less means "
            f"{DEFAULT_APPROVAL_TIMEOUT_SECS}; applies to payments parked afterwards"
        )
    if key == "tip_wait_secs":
        return (
            f"{_set(command, 'tip_wait_secs=N')}: seconds a payment may take to be confirmed; "
            f"0 or less means {DEFAULT_TIP_WAIT_SECS}"
        )
    if key == "token":
        return (
            f"{_set(command, 'token=')} mints a new random one (or give one of at least {MIN_TOKEN_CHARS} "
            f"characters); see it with <code>{esc(command)} settings --show-token</code>; agents then "
            f"need the new one: <code>{esc(command)} config-snippet BOT_UID</code>"
        )
    if key == "allowed_bots":
        return f"{_set(command, 'allowed_bots=UID,UID')}: the whole list (64-hex uids); empty allows none"
    if key == "prepay_bots":
        return (
            f"{_set(command, 'prepay_bots=UID,UID')}: bots whose balance is topped up ahead of need; "
            "empty turns prepay off"
        )
    if key == "directories":
        return (
            f"{_set(command, 'directories=UID,UID')}: the directories <code>{esc(command)} find</code> "
            "asks (64-hex uids; reachable like allowed bots); empty asks none"
        )
    return _set(command, f"{key}=VALUE")


def _uid_list(bots: tuple[str, ...] | None) -> str:
    return (
        "<ul>" + ("".join(f"<li><code>{esc(b)}</code></li>" for b in bots or ()) or "<li>none</li>") + "</ul>"
    )


def render_settings(
    settings: Settings, command: str = "brmcp-bridge", settings_file: str | None = None
) -> str:
    """The settings in force (the agents' token hidden), each with the
    command that changes it."""
    items = [
        ("enabled", esc("true" if settings.enabled else "false")),
        ("mode", esc(settings.mode)),
        ("per_call_cap_atoms", atoms_text(settings.per_call_cap_atoms)),
        ("per_day_cap_atoms", atoms_text(settings.per_day_cap_atoms)),
        ("approval_timeout_secs", esc(settings.approval_timeout_secs)),
        ("tip_wait_secs", esc(settings.tip_wait_secs)),
        ("token", "set (hidden)" if settings.token else "not set"),
        ("allowed_bots", _uid_list(settings.allowed_bots)),
        ("prepay_bots", _uid_list(settings.prepay_bots)),
        ("directories", _uid_list(settings.directories)),
    ]
    rows = "".join(
        f'<tr><th>{esc(k)}</th><td>{v}</td><td class="how">{_how_to_change(k, settings, command)}</td></tr>'
        for k, v in items
    )
    where = (
        f"<code>{esc(settings_file)}</code>"
        if settings_file
        else "<code>mcpclient.json</code> in the data directory"
    )
    return (
        '<table class="settings"><thead><tr><th>Key</th><th>Value</th><th>How to change it</th></tr></thead>'
        f"<tbody>{rows}</tbody></table>"
        f"<p>Change them with <code>{esc(command)} settings set KEY=VALUE</code> (several pairs at once "
        "are fine): the running daemon applies them at once and writes them to "
        f"{where}. That file can also be edited by hand: the daemon reads it again on SIGHUP "
        "or when it restarts.</p>"
        "<p>The daemon's own options are not settings: <code>--listen</code>, <code>--metrics</code>, "
        "<code>--log-level</code> and <code>--notify-command</code> on its command line (or "
        "<code>approvalnotify</code> and the logging keys in <code>brmcp-bridge.conf</code>, next to "
        "that file) apply when it restarts.</p>"
    )


def caps_of(settings: Settings) -> dict[str, object]:
    """The caps an added bot gets (the bridge's, for every bot), as the
    page's script reads them: ``{"perCallCapAtoms", "perDayCapAtoms",
    "mode"}`` (atoms; 0 or less means never pay)."""
    return {
        "perCallCapAtoms": settings.per_call_cap_atoms,
        "perDayCapAtoms": settings.per_day_cap_atoms,
        "mode": settings.mode,
    }


def render_find(settings: Settings, command: str = "brmcp-bridge") -> str:
    """The "Find tools" view: a search form (query, optional tag, optional
    highest price in atoms), the element the script fills with the hits
    (as text only), and the confirmation an Add opens. Searching changes
    nothing; an Add happens only when the user confirms it."""
    directories = len(settings.directories or ())
    if not directories:
        hint = (
            "No directories are configured; add one with "
            f"{_set(command, 'directories=<directory uid>')} (its operator gives you its uid)."
        )
    else:
        hint = (
            f"Asks the {directories} configured directory(ies). A priced search is a paid call under "
            "your caps (in approval mode it waits above for your decision)."
        )
    return (
        f'<p class="find-hint">{hint}</p>'
        '<form id="find-form" class="find" method="get" action="/ui/">'
        '<label>Query <input type="search" id="find-query" name="query" maxlength="256" required></label> '
        '<label>Tag <input type="text" id="find-tag" name="tag" maxlength="64"></label> '
        '<label>Max price (atoms) <input type="number" id="find-max-price" name="maxPriceAtoms" min="0" '
        'step="1"></label> <button type="submit" id="find-go">Search</button></form>'
        f'<p class="noscript-note">Searching here needs the page\'s script; or run '
        f"<code>{esc(command)} find QUERY</code>.</p>"
        '<div id="find-results" aria-live="polite"></div>'
        f'<span id="find-caps" hidden data-per-call="{settings.per_call_cap_atoms}" '
        f'data-per-day="{settings.per_day_cap_atoms}" data-mode="{esc(settings.mode)}"></span>'
        '<div id="add-confirm" class="confirm" hidden>'
        '<p><strong>Add bot</strong> <code id="add-uid"></code>?</p>'
        '<p id="add-caps"></p>'
        '<p class="small">The caps are the bridge\'s, for every bot. Leave a field empty to keep it.</p>'
        '<label>Per-call cap (atoms) <input type="number" id="add-per-call" min="0" step="1"></label> '
        '<label>Per-day cap (atoms) <input type="number" id="add-per-day" min="0" step="1"></label>'
        '<p><button type="button" id="add-yes" class="approve">Confirm: add this bot</button> '
        '<button type="button" id="add-cancel">Cancel</button></p>'
        '<p id="add-progress" role="status"></p></div>'
    )


def render_fragments(state: PageState, csrf: str) -> dict[str, object]:
    """The page's live parts: HTML by element id (``approvals``,
    ``bot-requests``, ``decisions``, ``spend``, ``balances``, ``settings``),
    ``caps`` (:func:`caps_of`), ``pending_count``,
    ``version``, ``now`` (the bridge clock) and ``pending``: one object per
    parked payment, ``{"id", "arguments", "remaining"}``, where
    ``arguments`` is the call's argument text (or null) for the script to
    put into the row as text (the ``approvals`` HTML leaves it out) and
    ``remaining`` the seconds left (or null). The script's long-poll JSON."""
    return {
        "version": state.version,
        "now": state.now,
        "approvals": render_approvals(
            state.pending, csrf, state.settings, state.now, state.nicks, inline_args=False
        ),
        "bot-requests": render_bot_requests(state.bot_requests, csrf, state.now, state.nicks),
        "caps": caps_of(state.settings),
        "pending_count": len(state.pending),
        "pending": [
            {
                "id": p.id,
                "arguments": p.arguments,
                "remaining": None if p.expires is None else max(0.0, round(p.expires - state.now, 1)),
            }
            for p in state.pending
        ],
        "decisions": render_decisions(state.recent, state.nicks),
        "spend": render_spend(state.spend, state.settings, state.now, state.nicks),
        "balances": render_balances(state.balances, state.nicks),
        "settings": render_settings(state.settings, state.command, state.settings_file),
    }


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem auto;max-width:76rem;padding:0 1rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%;margin:.5rem 0}th,td{text-align:left;padding:.3rem .5rem;
border-bottom:1px solid #eee;vertical-align:top}td.num{text-align:right;font-variant-numeric:tabular-nums}
form.decide{display:inline;margin-right:.3rem}button{padding:.3rem .9rem;cursor:pointer}
button.approve{background:#1b7f3b;color:#fff;border:0}button.deny{background:#b3261e;color:#fff;border:0}
tr.failed td{color:#b3261e}.empty{color:#666}#status{float:right;color:#666;font-size:.85rem}
meter{width:10rem}.notice{padding:.4rem .6rem;border-radius:4px}.notice:empty{display:none}
.notice.ok{background:#e6f4ea;color:#14532d}.notice.late,.notice.error{background:#fce8e6;color:#8c1d18}
pre.args{max-height:14rem;max-width:34rem;overflow:auto;background:#f6f6f6;padding:.3rem .5rem;
margin:.3rem 0 0;white-space:pre-wrap;word-break:break-all;font-size:.8rem}
.noargs{color:#666;font-size:.85rem;margin:.3rem 0 0}
.tool{font-weight:600}.nick{font-weight:600}.countdown{font-variant-numeric:tabular-nums;white-space:nowrap}
.countdown.urgent{color:#b3261e;font-weight:600}ul.decisions li.approved{color:#14532d}
ul.decisions li.denied,ul.decisions li.timeout,ul.decisions li.withdrawn,ul.decisions li.failed,
ul.decisions li.not-paid{color:#8c1d18}
td.how{font-size:.85rem;color:#444}
ul.bot-requests li{margin:.4rem 0}.bot-request .ask{font-weight:600}.bot-request .actions{margin-top:.2rem}
form.find label,div.confirm label{margin-right:.6rem}div.confirm{border:2px solid #1b7f3b;padding:.5rem .8rem;
margin:.5rem 0;border-radius:4px;background:#f4fbf6}.hit{border-bottom:1px solid #eee;padding:.4rem 0}
.hit .uid{font-family:monospace;word-break:break-all}.hit .claim,.find-failed li{font-size:.85rem;color:#444}
.find-failed{color:#8c1d18}.small{font-size:.85rem;color:#444}
"""


def render_page(state: PageState, csrf: str) -> str:
    """The whole page."""
    parts = render_fragments(state, csrf)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta name="brmcp-csrf" content="{esc(csrf)}">'
        f"<title>brmcp bridge: approvals</title><style>{_STYLE}</style></head>"
        f'<body data-version="{state.version}">'
        '<span id="status">static page: reload to update</span>'
        "<h1>brmcp bridge</h1>"
        '<p id="notice" class="notice" role="status" aria-live="polite"></p>'
        f'<h2>Waiting for approval (<span id="pending-count">{len(state.pending)}</span>)</h2>'
        f'<section id="approvals">'
        f"{render_approvals(state.pending, csrf, state.settings, state.now, state.nicks)}</section>"
        f'<section id="bot-requests">{parts["bot-requests"]}</section>'
        f'<h2>Recent decisions</h2><section id="decisions">{parts["decisions"]}</section>'
        f'<h2>Spending</h2><section id="spend">{parts["spend"]}</section>'
        f'<h2>Balances at bots</h2><section id="balances">{parts["balances"]}</section>'
        f'<h2>Find tools</h2><section id="find">{render_find(state.settings, state.command)}</section>'
        f'<h2>Settings</h2><section id="settings">{parts["settings"]}</section>'
        '<form method="post" action="/ui/logout"><input type="hidden" name="csrf" '
        f'value="{esc(csrf)}"><button type="submit">Log out</button></form>'
        '<script src="/ui/app.js"></script></body></html>'
    )


def render_notice(message: str, back: str) -> str:
    """A page with one message (e.g. a decision refused because the payment
    was withdrawn or timed out) and a link back to ``back``."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>brmcp bridge</title>"
        f"<style>{_STYLE}</style></head><body><h1>brmcp bridge</h1>"
        f'<p id="notice" class="notice late" role="alert">{esc(message)}</p>'
        f'<p><a href="{esc(back)}">Back to the approvals</a></p></body></html>'
    )


def render_login_needed(reason: str, command: str = "brmcp-bridge") -> str:
    """The page shown without a session; ``command`` is the bridge's command
    line (with ``--datadir`` when needed)."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>brmcp bridge: log in</title>"
        f"<style>{_STYLE}</style></head><body><h1>brmcp bridge</h1>"
        f'<section id="login-needed"><p>{esc(reason)}</p>'
        f"<p>Get a one-time login link with <code>{esc(command)} ui</code>.</p>"
        "</section></body></html>"
    )
