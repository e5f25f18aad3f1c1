"""The approvals page over plain HTTP (no browser): one-time login links
minted with the admin token, the session cookie, CSRF on every decision,
escaping of what bots send, the long-poll, the no-script form flow, and the
daemon's approval notification command; what a pending payment shows (its
call's bounded arguments, the time left on the bridge clock, the bot's nick
from brclient next to its uid), the confirmation of a decision and the
refusal of one that comes too late, fakebr's ``ChatService.UserNick``, and
how the page says each setting is changed; the "Find tools" view's calls
(``/ui/api/…``: CSRF header, only the discovery routes and the add-bot
settings change, no token) and the agents' add-bot requests shown and
decided on the page."""

from __future__ import annotations

import base64
import contextlib
import html
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from brmcp.bridge.admin.ui import NickBook, PageState, UISessions, render_page, time_left
from brmcp.bridge.cli import main as bridge_main
from brmcp.bridge.daemon import BridgeDaemon
from brmcp.bridge.pay import (
    MAX_ARGUMENT_CHARS,
    BotBalance,
    PendingPayment,
    SpendEntry,
    SpendSummary,
    describe_arguments,
)
from brmcp.clientrpc.nicks import (
    NICK_RETRY_SECS,
    NICK_TTL_SECS,
    USER_NICK,
    NickSource,
    clientrpc_user_nick,
    display_nick,
)
from brmcp.clientrpc.patient import PatientSender
from brmcp.testing import uid
from tests.kit.bridge import (
    BOT,
    CLIENT,
    START,
    TOKEN,
    Env,
    TestPayer,
    bridge_env,
    build_harness,
    call,
    fixture_settings,
    joined,
    until,
)
from tests.kit.paths import REPO


async def _login(env: Env, http: httpx2.AsyncClient) -> str:
    """Log ``http`` in; returns the page's CSRF token."""
    admin = {"Authorization": f"Bearer {env.bridge.admin_token}"}
    minted = await http.post("/admin/ui-login", headers=admin)
    assert minted.status_code == 200
    url = minted.json()["url"]
    assert minted.json()["expires_in"] == 300
    login = await http.get(url.replace(env.base_url, ""))
    assert login.status_code == 303
    assert login.headers["location"] == "/ui/"
    cookie = login.headers["set-cookie"]
    for part in ("brmcp_ui=", "HttpOnly", "SameSite=Strict", "Path=/ui"):
        assert part in cookie
    page = await http.get("/ui/")
    assert page.status_code == 200
    marker = 'name="brmcp-csrf" content="'
    start = page.text.index(marker) + len(marker)
    return page.text[start : page.text.index('"', start)]


async def test_login_needs_the_admin_token_and_works_once(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            assert (await http.post("/admin/ui-login")).status_code == 401
            agent = {"Authorization": f"Bearer {TOKEN}"}
            assert (await http.post("/admin/ui-login", headers=agent)).status_code == 401
            no_session = await http.get("/ui/")
            assert no_session.status_code == 401
            assert f"brmcp-bridge --datadir {env.data_dir} ui" in no_session.text
            answer = (await http.get("/ui/state", headers={"Accept": "application/json"})).json()
            assert answer == {
                "error": f"not logged in; get a login link with: brmcp-bridge --datadir {env.data_dir} ui"
            }
            state = await http.get("/ui/state", headers={"Accept": "application/json"})
            assert state.status_code == 401
            forged = await http.get("/ui/login?ticket=" + "0" * 32)
            assert forged.status_code == 401
            admin = {"Authorization": f"Bearer {env.bridge.admin_token}"}
            url = (await http.post("/admin/ui-login", headers=admin)).json()["url"]
            path = url.replace(env.base_url, "")
            assert (await http.get(path)).status_code == 303
            async with env.http() as other:
                assert (await other.get(path)).status_code == 401  # used
            page = await http.get("/ui/")
            assert page.status_code == 200
            for header, value in (
                ("x-frame-options", "DENY"),
                ("cache-control", "no-store"),
                ("x-content-type-options", "nosniff"),
            ):
                assert page.headers[header] == value
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert "<script>" not in page.text  # no inline script
            assert TOKEN not in page.text
            assert env.bridge.admin_token not in page.text
            script = await http.get("/ui/app.js")
            assert script.status_code == 200
            assert script.headers["content-type"].startswith("text/javascript")
            # A foreign Origin is refused before any of this.
            evil = await http.get("/ui/", headers={"Origin": "http://evil.example"})
            assert evil.status_code == 403


def test_tickets_expire_and_sessions_end() -> None:
    now = [1000.0]
    sessions = UISessions(now=lambda: now[0])
    ticket = sessions.mint_ticket()
    now[0] += 301
    assert sessions.redeem(ticket) is None
    session = sessions.redeem(sessions.mint_ticket())
    assert session is not None
    assert sessions.session(session.sid) == session
    assert sessions.session("x" * 32) is None
    now[0] += 12 * 3600 + 1
    assert sessions.session(session.sid) is None


async def test_decisions_need_the_csrf_token_and_work_without_script(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.http() as http:
            csrf = await _login(env, http)
            version = (await http.get("/ui/state")).json()["version"]
            async with env.session() as session, anyio.create_task_group() as tg:
                results: list[Any] = []

                async def paid() -> None:
                    results.append(await call(session, "paid", {"text": "x", "count": 1}))

                # The long-poll answers as soon as the payment is parked.
                async def poll() -> None:
                    answer = await http.get(f"/ui/state?after={version}")
                    polled.append(answer.json())

                polled: list[dict[str, Any]] = []
                watching = len(env.bridge._settler._listeners)
                tg.start_soon(poll)
                # The long-poll waits: it watches the bridge for a change.
                await until(lambda: len(env.bridge._settler._listeners) == watching + 1)
                assert polled == []
                tg.start_soon(paid)
                await until(lambda: bool(polled))
                (pending,) = env.bridge.pending_payments()
                assert polled[0]["pending_count"] == 1
                assert pending.id in polled[0]["approvals"]
                base = f"/ui/approvals/{pending.id}/approve"
                assert (await http.post(base)).status_code == 403
                assert (await http.post(base, headers={"X-CSRF-Token": "wrong"})).status_code == 403
                assert (await http.post(base, data={"csrf": "wrong"})).status_code == 403
                assert env.bridge.pending_payments() == [pending]
                decided = await http.post(base, data={"csrf": csrf})  # the plain HTML form
                assert decided.status_code == 303
                assert decided.headers["location"] == "/ui/"
            (result,) = results
            assert not result.is_error
            assert env.payer.calls == [(BOT, 500)]
            again = await http.post(base, headers={"X-CSRF-Token": csrf, "Accept": "application/json"})
            assert again.status_code == 409
            assert again.json() == {
                "error": f"payment {pending.id} was already approved; a second decision does not count"
            }
            unknown = await http.post(
                "/ui/approvals/0123456789abcdef/approve",
                headers={"X-CSRF-Token": csrf, "Accept": "application/json"},
            )
            assert unknown.status_code == 404
            logout = await http.post("/ui/logout", data={"csrf": csrf})
            assert logout.status_code == 303
            assert (await http.get("/ui/")).status_code == 401


def test_what_bots_send_is_escaped() -> None:
    from brmcp.bridge import Settings

    hostile = '<img src=x onerror="alert(1)">'
    state = PageState(
        settings=Settings(enabled=True, token="t" * 32, allowed_bots=(BOT,)),
        pending=(PendingPayment("abc", BOT, hostile, 5, 1_800_000_000),),
        spend=SpendSummary(
            (SpendEntry(ts=1_800_000_000, bot=BOT, tool=hostile, atoms=5, status="failed", err=hostile),), 0
        ),
        balances={BOT: BotBalance(atoms=7, ts=1_800_000_000)},
        now=1_800_000_100,
        version=3,
    )
    page = render_page(state, "csrf-token")
    assert hostile not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert "t" * 32 not in page


async def test_balances_from_receipts(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            assert env.bridge.bot_balances() == {}
            assert not (await call(session, "paid", {"text": "x", "count": 1})).is_error
            balances = env.bridge.bot_balances()
            assert set(balances) == {BOT}
            assert balances[BOT].atoms == 0  # paid exactly the price, then charged it


async def test_cli_ui_without_a_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bridge_main(["--datadir", str(tmp_path), "ui"]) == 1
    err = capsys.readouterr().err
    assert "the approvals page is served by the running daemon, and it is not running" in err


async def test_notification_command_runs_once_per_parked_payment(tmp_path: Path) -> None:
    out = tmp_path / "notified.jsonl"
    script = (
        "import json, os, sys; "
        f"open({str(out)!r}, 'a').write(json.dumps({{k: v for k, v in os.environ.items() "
        "if k.startswith('BRMCP_')}) + '\\n')"
    )
    command = f"{sys.executable} -c {json.dumps(script)}"
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env:
            # The daemon's hook, on the fixture's bridge (no brclient needed).
            daemon = BridgeDaemon.__new__(BridgeDaemon)
            daemon.bridge = env.bridge
            daemon.datadir = env.data_dir
            daemon.notify_command = command
            daemon._notified = set()
            async with anyio.create_task_group() as tg:
                daemon._tg = tg
                unwatch = env.bridge.watch(daemon._on_change)
                async with env.session() as session:
                    results: list[Any] = []

                    async def paid() -> None:
                        results.append(await call(session, "paid", {"text": "x", "count": 1}))

                    tg.start_soon(paid)
                    await until(lambda: out.exists() and out.read_text().count("\n") == 1)
                    (pending,) = env.bridge.pending_payments()
                    env.bridge.resolve_payment(pending.id, False)
                    await until(lambda: not env.bridge.pending_payments())
                    # The denied call's answer arrives before its session closes.
                    await until(lambda: bool(results))
                unwatch()
                tg.cancel_scope.cancel()
    (line,) = out.read_text().splitlines()
    seen = json.loads(line)
    assert seen["BRMCP_PAYMENT_ID"] == pending.id
    assert seen["BRMCP_BOT"] == BOT
    assert seen["BRMCP_TOOL"] == "paid"
    assert seen["BRMCP_ATOMS"] == "500"
    assert seen["BRMCP_APPROVE_COMMAND"].endswith(f"approvals approve {pending.id}")
    assert TOKEN not in line


async def test_settings_footer_names_the_data_dir(tmp_path: Path) -> None:
    """The page's "Change them with …" command can be pasted as printed: it
    carries --datadir for a bridge whose data dir is not the default."""
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            await _login(env, http)
            page = (await http.get("/ui/")).text
            assert f"<code>brmcp-bridge --datadir {env.data_dir} settings set KEY=VALUE</code>" in page


def test_cli_command_adds_datadir_only_when_not_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import brmcp.bridge.base._command as _command
    from brmcp.bridge.base import cli_command

    monkeypatch.setattr(_command, "default_datadir", lambda: tmp_path / "default")
    assert cli_command(tmp_path / "default") == "brmcp-bridge"
    assert cli_command(tmp_path / "other") == f"brmcp-bridge --datadir {tmp_path / 'other'}"
    spaced = tmp_path / "my bridge"
    assert cli_command(spaced) == f"brmcp-bridge --datadir '{spaced}'"
    settings = fixture_settings()
    state = PageState(settings, (), SpendSummary((), 0), {}, now=0, version=1)
    assert "<code>brmcp-bridge settings set KEY=VALUE</code>" in render_page(state, "csrf")


def test_bridge_md_explains_agent_timeouts_in_approval_mode() -> None:
    text = (REPO / "BRIDGE.md").read_text()
    section = text[text.index("## Approvals page") : text.index("## Embedding the library")]
    for needle in (
        "approval_timeout_secs",
        "120 s by default",
        "60 s",
        "MCP_SERVER_REQUEST_TIMEOUT",
        "Reset Timeout on Progress",
        "MCP_TOOL_TIMEOUT=300000 claude",
    ):
        assert needle in section, needle


# -- what a pending payment shows: arguments, countdown, confirmation ------------------

HOSTILE = '<img src=x onerror="alert(1)">'
JSON_HEADERS = {"Accept": "application/json"}


def _csrf_headers(csrf: str) -> dict[str, str]:
    return {"X-CSRF-Token": csrf, **JSON_HEADERS}


def test_call_arguments_are_bounded_and_what_does_not_print_is_escaped() -> None:
    assert describe_arguments(None) is None
    assert describe_arguments({}) == "{}"
    small = {"text": "héllo", "count": 1, "nested": {"ok": [True, None, 1.5]}}
    assert json.loads(describe_arguments(small) or "") == small  # readable JSON, unicode kept
    shown = describe_arguments({"bidi": "a\u202eb", "nul": "x\x00y", "tag": "\U000e0041"}) or ""
    for hidden in ("\u202e", "\x00", "\U000e0041"):
        assert hidden not in shown
    assert json.loads(shown) == {"bidi": "a\u202eb", "nul": "x\x00y", "tag": "\U000e0041"}
    long = describe_arguments({"k" * 1000: "v" * 10_000, "list": list(range(1000))}) or ""
    assert len(long) <= MAX_ARGUMENT_CHARS
    assert "(+744 chars)" in long  # the key cut at 256 characters
    assert "(+9744 chars)" in long  # the value too
    assert "(+968 more items)" in long
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(50):
        node["d"] = {}
        node = node["d"]
    assert "nested too deep" in (describe_arguments(deep) or "")
    many = describe_arguments({f"key{i}": "x" * 250 for i in range(32)}) or ""
    body, _, tail = many.rpartition("\n")
    assert len(body) == MAX_ARGUMENT_CHARS
    assert re.fullmatch(rf"… \(cut at {MAX_ARGUMENT_CHARS} of \d+ characters\)", tail)


def test_countdown_text() -> None:
    assert time_left(120) == "2m 00s left"
    assert time_left(89.9) == "1m 29s left"
    assert time_left(9.5) == "9s left"
    assert time_left(0) == "time is up"
    assert time_left(-3) == "time is up"


async def test_a_pending_payment_shows_its_arguments_time_left_and_then_the_decision(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.http() as http:
            csrf = await _login(env, http)
            async with env.session() as session, anyio.create_task_group() as tg:
                results: list[Any] = []

                async def paid() -> None:
                    results.append(await call(session, "paid", {"text": HOSTILE, "count": 1}))

                tg.start_soon(paid)
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (pending,) = env.bridge.pending_payments()
                assert pending.expires == START + 120
                state = (await http.get("/ui/state")).json()
                (row,) = state["pending"]
                assert row == {
                    "id": pending.id,
                    "arguments": describe_arguments({"text": HOSTILE, "count": 1}),
                    "remaining": 120.0,
                }
                assert HOSTILE.replace('"', '\\"') in row["arguments"]
                # The live HTML leaves the arguments out: the script sets them as text.
                assert "onerror" not in state["approvals"]
                assert f'<pre class="args" data-args-for="{pending.id}"></pre>' in state["approvals"]
                assert 'data-remaining="120.0">2m 00s left</span>' in state["approvals"]
                assert "refused at 2027-01-15 08:02:00 UTC" in state["approvals"]
                env.clock.advance(30)
                state = (await http.get("/ui/state")).json()
                assert state["pending"][0]["remaining"] == 90.0
                assert "1m 30s left" in state["approvals"]
                # The page itself carries them, escaped, for a browser without the script.
                page = (await http.get("/ui/")).text
                assert HOSTILE not in page
                assert "&lt;img src=x onerror=\\&quot;alert(1)\\&quot;&gt;" in page
                assert "No payment ended in the last 10 minutes." in page
                decided = await http.post(f"/ui/approvals/{pending.id}/approve", headers=_csrf_headers(csrf))
                assert decided.status_code == 200
                prefix = f"{BOT[:16]}…"
                assert decided.json() == {
                    "id": pending.id,
                    "approved": True,
                    "message": f"Approved: 500 atoms to {prefix} for tool paid; the payment is being made"
                    " (see Spending)",
                }
            (result,) = results
            assert not result.is_error
            state = (await http.get("/ui/state")).json()
            assert state["pending"] == []
            assert f"Approved: 500 atoms to {prefix} for tool paid" in state["decisions"]
            # Once the spend log says it was paid, so does the decision.
            assert [e.status for e in env.bridge.spend_log().entries] == ["paid"]
            assert f"Approved: 500 atoms to {prefix} for tool paid; paid " in state["decisions"]
            assert "being made" not in state["decisions"]
            assert '<li class="approved paid">' in state["decisions"]
            assert "2027-01-15 08:00:30 UTC" in state["decisions"]
            # It stays listed for ten minutes (bridge clock), then goes.
            env.clock.advance(599)
            assert "Approved: 500 atoms" in (await http.get("/ui/state")).json()["decisions"]
            env.clock.advance(2)
            assert "No payment ended" in (await http.get("/ui/state")).json()["decisions"]


@pytest.mark.parametrize("outcome", ["failed", "unknown", "not made"])
async def test_recent_decisions_say_what_became_of_an_approved_payment(tmp_path: Path, outcome: str) -> None:
    """An approved payment that brclient refused, whose outcome is not
    known, or that was not made after all (the cap was lowered while it
    waited): "Recent decisions" says so from the spend log, instead of
    "being made" forever."""
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.http() as http:
            csrf = await _login(env, http)

            async def refused(payee: str, atoms: int) -> None:
                raise RuntimeError("insufficient funds")

            class MayLand(Exception):
                may_land = True

            async def stalled(payee: str, atoms: int) -> None:
                raise MayLand("tip cannot complete now: no route; brclient retries it later")

            if outcome == "failed":
                env.payer.behaviour = refused
            elif outcome == "unknown":
                env.payer.behaviour = stalled
            async with env.session() as session, anyio.create_task_group() as tg:
                tg.start_soon(call, session, "paid")
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (pending,) = env.bridge.pending_payments()
                if outcome == "not made":
                    await env.bridge.apply_settings(env.bridge.settings.replace(per_call_cap_atoms=100))
                decided = await http.post(f"/ui/approvals/{pending.id}/approve", headers=_csrf_headers(csrf))
                assert decided.status_code == 200
                # The call's answer (after the task group) comes after the payment's end.
            decisions = (await http.get("/ui/state")).json()["decisions"]
            assert "being made" not in decisions
            prefix = f"{BOT[:16]}…"
            what = f"Approved: 500 atoms to {prefix} for tool paid; "
            if outcome == "failed":
                assert f"{what}the payment failed: insufficient funds; nothing was paid" in decisions
                assert '<li class="approved failed">' in decisions
            elif outcome == "unknown":
                why = "tip cannot complete now: no route; brclient retries it later"
                assert (
                    f"{what}its outcome is not known yet ({why}); it stays pending, and counted, in Spending"
                    " until brclient reports it"
                ) in decisions
                assert '<li class="approved pending">' in decisions
            else:
                assert f"{what}not paid: 500 atoms exceeds the per-call cap (100)" in decisions
                assert '<li class="approved not-paid">' in decisions
                assert env.payer.calls == []


async def test_an_approval_that_comes_too_late_is_refused_with_the_reason(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.http() as http:
            csrf = await _login(env, http)
            async with env.session() as session, anyio.create_task_group() as tg:
                results: list[Any] = []

                async def paid() -> None:
                    results.append(await call(session, "paid", {"text": "x", "count": 1}))

                tg.start_soon(paid)
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (pending,) = env.bridge.pending_payments()
                env.clock.advance(120)
                await until(lambda: bool(results))
            assert "approval timed out after 2m0s" in joined(results[0])
            late = (
                f"too late: payment {pending.id} timed out after 2m0s without a decision; nothing was paid"
                " and the agent was told the approval timed out"
            )
            path = f"/ui/approvals/{pending.id}/approve"
            as_json = await http.post(path, headers=_csrf_headers(csrf))
            assert (as_json.status_code, as_json.json()) == (409, {"error": late})
            as_form = await http.post(path, data={"csrf": csrf})
            assert as_form.status_code == 409
            assert late in as_form.text
            decisions = (await http.get("/ui/state")).json()["decisions"]
            assert (
                f"Timed out: 500 atoms to {BOT[:16]}… for tool paid: no decision within 2m0s, so nothing was"
                " paid" in decisions
            )
            assert env.payer.calls == []


async def test_a_second_decision_the_other_way_does_not_count(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.http() as http:
            csrf = await _login(env, http)
            async with env.session() as session, anyio.create_task_group() as tg:
                results: list[Any] = []

                async def paid() -> None:
                    results.append(await call(session, "paid", {"text": "x", "count": 1}))

                tg.start_soon(paid)
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (pending,) = env.bridge.pending_payments()
                # Both arrive before the call has moved on: the first counts.
                assert env.bridge.resolve_payment(pending.id, False)
                other = await http.post(f"/ui/approvals/{pending.id}/approve", headers=_csrf_headers(csrf))
                assert other.status_code == 409
                assert other.json()["error"] == (
                    f"payment {pending.id} was already denied; a second decision does not count"
                )
            assert "payment denied by the user" in joined(results[0])
            assert env.payer.calls == []


# -- nicks -----------------------------------------------------------------------------


class _Nicks:
    """A :class:`NickSource` over a dict, counting the look-ups."""

    def __init__(self, nicks: dict[str, str]) -> None:
        self.nicks = nicks
        self.asked: list[str] = []
        self.hang = False

    async def user_nick(self, uid: str) -> str:
        self.asked.append(uid)
        if self.hang:
            await anyio.sleep_forever()
        if uid not in self.nicks:
            raise RuntimeError(f"user {uid} not found")
        return self.nicks[uid]


def test_nicks_are_made_displayable() -> None:
    assert display_nick("alice") == "alice"
    assert display_nick("  ali\u202ece\x00\n bob\u00a0 ") == "alice bob"
    assert display_nick("\u200b\u202e") is None
    assert display_nick("") is None
    assert display_nick("n" * 100) == "n" * 39 + "…"


async def test_the_nick_book_caches_retries_and_stays_bounded() -> None:
    now = [1000.0]
    a, b, c = uid(1), uid(3), uid(4)
    source = _Nicks({a: "alice", b: "bob"})
    book = NickBook(source, now=lambda: now[0], max_entries=2)
    assert book.source is source
    await book.refresh([a, a.upper(), "not-a-uid", b, c])
    assert source.asked == [a, b, c]
    # Bounded: the oldest (a) was dropped for the failed look-up of c.
    assert book.known([a, b, c]) == {b: "bob"}
    await book.refresh([b, c])
    assert source.asked == [a, b, c]  # cached, the failure too
    now[0] += NICK_RETRY_SECS
    await book.refresh([b, c])
    assert source.asked == [a, b, c, c]  # the failure is asked again; the nick is not due yet
    now[0] += NICK_TTL_SECS
    source.nicks[b] = "bobby"
    await book.refresh([b])
    assert book.nick(b.upper()) == "bobby"
    # A source that does not answer costs at most the budget; it is asked again next time.
    source.hang = True
    with anyio.fail_after(5):
        await book.refresh([a], budget=0.05)
    assert book.nick(a) is None
    assert source.asked[-1] == a
    assert NickBook(None).known([a]) == {}


async def test_user_nick_over_clientrpc_matches_brclient(tmp_path: Path) -> None:
    from brmcp.clientrpc import ClientrpcNotConnected, RPCError
    from tests.kit.clientrpc import FAST, fake_network

    with anyio.fail_after(30):
        async with fake_network(tmp_path, "me", "fortune-bot", "stranger") as (relay, (me, bot, stranger)):
            relay.unkx(me, stranger)
            async with me.client(**FAST) as client:
                await client.wait_connected()
                assert await clientrpc_user_nick(client, bot.uid) == "fortune-bot"
                raw = await client.call(USER_NICK, {"uid": base64.b64encode(bytes.fromhex(bot.uid)).decode()})
                assert raw == {"nick": "fortune-bot"}
                assert await client.call(USER_NICK, {"hexUid": bot.uid.upper()}) == {"nick": "fortune-bot"}
                for who in (stranger.uid, me.uid):
                    with pytest.raises(RPCError, match=f"^user {who} not found$"):
                        await clientrpc_user_nick(client, who)
                with pytest.raises(RPCError, match=r"^invalid uid and hex_uid$"):
                    await client.call(USER_NICK, {"hexUid": bot.uid[:10]})
                with pytest.raises(RPCError, match=r"^invalid uid and hex_uid$"):
                    await client.call(USER_NICK, {"uid": base64.b64encode(b"short").decode()})
                with pytest.raises(RPCError, match=r"^encoding/hex: invalid byte: U\+0067 'g'$"):
                    await client.call(USER_NICK, {"hexUid": "g" * 64})
                with pytest.raises(RPCError, match=r"^unable to decode params: "):
                    await client.call(USER_NICK, {"nick": "x"})
                # The daemon's PM sender is the page's nick source.
                sender = PatientSender(client)
                assert isinstance(sender, NickSource)
                assert await sender.user_nick(bot.uid) == "fortune-bot"
                relay.nicks[bot.uid] = ""
                assert await client.call(USER_NICK, {"hexUid": bot.uid}) == {}
                assert await clientrpc_user_nick(client, bot.uid) == ""
            with pytest.raises(ClientrpcNotConnected):
                await clientrpc_user_nick(client, bot.uid)


class _NickingSender:
    """A PM sender on the fabric that names contacts through a fake
    brclient, as the daemon's sender does through the user's brclient."""

    def __init__(self, inner: Any, client: Any) -> None:
        self._inner = inner
        self._client = client

    async def send_pm(self, peer: str, text: str) -> None:
        await self._inner.send_pm(peer, text)

    async def user_nick(self, uid: str) -> str:
        return await clientrpc_user_nick(self._client, uid)


@contextlib.asynccontextmanager
async def _env_with_brclient_nicks(tmp_path: Path, bot_nick: str) -> AsyncIterator[Env]:
    """The fixture's bridge in approval mode, with a PM sender that asks a
    fake brclient (a contact ``bot_nick`` at BOT) for nicks."""
    from brmcp.bridge import ManualClock
    from brmcp.testing import Fabric
    from tests.kit.bridge import bridge_stack
    from tests.kit.clientrpc import FAST, fake_network

    async with contextlib.AsyncExitStack() as stack:
        relay, (me,) = await stack.enter_async_context(fake_network(tmp_path / "br", "me"))
        relay.add_user(bot_nick, uid=BOT)
        relay.kx(me, BOT)
        client = await stack.enter_async_context(me.client(**FAST))
        await client.wait_connected()
        executions: dict[str, int] = {}
        harness = build_harness(tmp_path / "bot", executions)
        payer = TestPayer()
        payer.harness = harness
        clock = ManualClock(START)
        fabric = Fabric()
        built = await stack.enter_async_context(
            bridge_stack(
                tmp_path,
                payer,
                bot=harness,
                settings=fixture_settings(mode="approval"),
                fabric=fabric,
                sender=_NickingSender(fabric.sender(CLIENT), client),
                clock=clock,
            )
        )
        yield Env(built.fabric, harness, built.bridge, payer, clock, built.data_dir, executions)


async def test_the_page_names_bots_by_brclient_nick_next_to_their_uid(tmp_path: Path) -> None:
    hostile_nick = '<b onmouseover="x()">ev\u202eil</b>'
    shown = "&lt;b onmouseover=&quot;x()&quot;&gt;evil&lt;/b&gt;"
    with anyio.fail_after(60):
        async with _env_with_brclient_nicks(tmp_path, hostile_nick) as env, env.http() as http:
            csrf = await _login(env, http)
            async with env.session() as session, anyio.create_task_group() as tg:
                tg.start_soon(call, session, "paid", {"text": "x", "count": 1})
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (pending,) = env.bridge.pending_payments()
                row = (await http.get("/ui/state")).json()["approvals"]
                assert (
                    f'<span class="nick" title="nick from brclient (not an identity)">{shown}</span>' in row
                )
                assert f'<code title="{BOT}">{BOT[:16]}…</code>' in row  # the uid stays
                assert 'onmouseover="' not in row
                assert "\u202e" not in row
                decided = await http.post(f"/ui/approvals/{pending.id}/deny", headers=_csrf_headers(csrf))
                assert decided.json()["message"] == (
                    f'Denied: 500 atoms to “<b onmouseover="x()">evil</b>” ({BOT[:16]}…) for tool paid;'
                    " nothing was paid"
                )
            decisions = (await http.get("/ui/state")).json()["decisions"]
            assert f"Denied: 500 atoms to “{shown}” ({BOT[:16]}…)" in decisions


def test_a_bridge_without_brclient_shows_uid_prefixes() -> None:
    from brmcp.bridge import Settings

    state = PageState(
        settings=Settings(enabled=True, token="t" * 32, allowed_bots=(BOT,)),
        pending=(PendingPayment("abc", BOT, "paid", 5, START, '{"a": 1}', START + 60.0),),
        spend=SpendSummary((), 0),
        balances={},
        now=START,
        version=1,
    )
    page = render_page(state, "csrf")
    assert f'<td class="bot"><code title="{BOT}">{BOT[:16]}…</code></td>' in page
    assert 'class="nick"' not in page
    assert "1m 00s left" in page


# -- settings: how to change each -------------------------------------------------------


async def test_every_setting_says_how_to_change_it_with_a_command_that_works(tmp_path: Path) -> None:
    from brmcp.bridge.base import setting_names
    from brmcp.bridge.cli import parse_pairs

    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            await _login(env, http)
            page = (await http.get("/ui/")).text
    command = f"brmcp-bridge --datadir {env.data_dir}"
    settings_html = page[page.index('<section id="settings">') :]
    keys = re.findall(r"<tr><th>([a-z_]+)</th><td>", settings_html)
    assert sorted(keys) == sorted(setting_names())
    suggested = re.findall(
        rf"<code>{re.escape(command)} settings set ([a-z_]+)=([A-Za-z0-9_,]*)</code>", page
    )
    assert {key for key, _ in suggested} >= set(setting_names())
    for key, value in suggested:
        example = value.replace("UID", BOT).replace("N", "5")
        assert key in parse_pairs([f"{key}={example}"])  # the CLI takes it as printed
    assert f"<code>{command} settings --show-token</code>" in page
    assert f"<code>{command} config-snippet BOT_UID</code>" in page
    assert f"<code>{env.data_dir / 'mcpclient.json'}</code>" in page
    assert "SIGHUP" in page
    assert "settings set mode=approval" in page  # the fixture is in autopay


# -- the "Find tools" view's calls and the agents' add-bot requests -----------------------------


def _allowed(env: Env) -> tuple[str, ...]:
    return env.bridge.settings.allowed_bots or ()


async def test_the_find_views_calls_need_the_csrf_header_and_reach_only_their_routes(tmp_path: Path) -> None:
    from brmcp.bridge.base import load_settings

    newcomer = uid(9)
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            csrf = await _login(env, http)
            api = {"X-CSRF-Token": csrf, "Accept": "application/json"}
            body = {"uid": newcomer}
            # The CSRF token must come as the header: a form field or nothing is refused.
            assert (await http.post("/ui/api/add-bot", json=body)).status_code == 403
            assert (await http.post("/ui/api/add-bot", data={"csrf": csrf})).status_code == 403
            wrong = {"X-CSRF-Token": "x" * len(csrf)}
            assert (await http.post("/ui/api/add-bot", json=body, headers=wrong)).status_code == 403
            # Only the find view's routes are reachable: never the token-bearing ones.
            for method, path in (
                ("GET", "/ui/api/settings"),
                ("POST", "/ui/api/settings"),
                ("GET", f"/ui/api/config-snippet/{BOT}"),
                ("POST", "/ui/api/ui-login"),
                ("GET", "/ui/api/find"),
                ("POST", f"/ui/api/contact/{BOT}"),
                ("POST", "/ui/api/approvals/abc/approve"),
            ):
                answer = await http.request(method, path, headers=api)
                assert answer.status_code == 404, (method, path)
                assert TOKEN not in answer.text
            # The discovery routes answer as they do on the admin surface.
            none = await http.post("/ui/api/find", json={"query": "x"}, headers=api)
            assert none.status_code == 409
            assert "directories" in none.json()["error"]
            bad = await http.post("/ui/api/find", json={"query": "x", "maxPriceAtoms": -1}, headers=api)
            assert bad.status_code == 400
            assert "maxPriceAtoms" in bad.json()["error"]
            contact = await http.get(f"/ui/api/contact/{newcomer}", headers=api)
            assert contact.json() == {"uid": newcomer, "contact": None}
            assert (await http.get("/ui/api/contact/nope", headers=api)).status_code == 400
            # Bad input is refused naming the field; nothing changed.
            for wrong_body, field in (
                ({"uid": "1a2b"}, "uid"),
                ({"uid": newcomer, "perCallCapAtoms": -5}, "perCallCapAtoms"),
                ({"uid": newcomer, "perDayCapAtoms": "9"}, "perDayCapAtoms"),
                ({"uid": newcomer, "perCallCapAtoms": True}, "perCallCapAtoms"),
                ({"uid": newcomer, "mode": "autopay"}, "unknown key 'mode'"),
                ({"uid": newcomer, "allowed_bots": [newcomer]}, "unknown key 'allowed_bots'"),
            ):
                refused = await http.post("/ui/api/add-bot", json=wrong_body, headers=api)
                assert refused.status_code == 400, wrong_body
                assert field in refused.json()["error"]
            not_json = await http.post("/ui/api/add-bot", content=b"[1]", headers=api)
            assert not_json.status_code == 400
            assert _allowed(env) == (BOT,)
            assert env.bridge.settings.per_call_cap_atoms == 10_000
            # A good add: exactly that uid appended, the caps given set, no token in the answer.
            added = await http.post(
                "/ui/api/add-bot", json={"uid": newcomer.upper(), "perDayCapAtoms": 5_000}, headers=api
            )
            assert added.status_code == 200, added.text
            answer = added.json()
            assert answer["uid"] == newcomer
            assert answer["added"] is True
            assert (answer["perCallCapAtoms"], answer["perDayCapAtoms"]) == (10_000, 5_000)
            assert answer["message"].startswith(f"Added bot {newcomer} to allowed_bots; caps for every bot")
            assert TOKEN not in added.text
            assert added.headers["x-frame-options"] == "DENY"
            assert _allowed(env) == (BOT, newcomer)
            assert env.bridge.settings.per_day_cap_atoms == 5_000
            assert load_settings(env.data_dir / "mcpclient.json").allowed_bots == (BOT, newcomer)
            again = (await http.post("/ui/api/add-bot", json={"uid": newcomer}, headers=api)).json()
            assert again["added"] is False
            assert _allowed(env) == (BOT, newcomer)
            # The caps the confirmation shows follow the settings in the live state.
            assert (await http.get("/ui/state")).json()["caps"] == {
                "perCallCapAtoms": 10_000,
                "perDayCapAtoms": 5_000,
                "mode": "autopay",
            }


async def test_an_agents_add_bot_request_is_shown_and_decided_on_the_page(tmp_path: Path) -> None:
    hostile = '<script>window.x=1</script><img src=x onerror="alert(1)">'
    wanted, unwanted = uid(10), uid(11)
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.http() as http:
            csrf = await _login(env, http)
            page = (await http.get("/ui/")).text
            assert '<section id="bot-requests"><h2>Add-bot requests from agents</h2>' in page
            assert "No agent asks to add a bot." in page
            answers: dict[str, Any] = {}
            queue = env.bridge.bot_requests
            async with anyio.create_task_group() as tg:

                async def ask(who: str) -> None:
                    answers[who] = await queue.request(who, reason=hostile, agent="claude-code 2.1")

                version = (await http.get("/ui/state")).json()["version"]
                tg.start_soon(ask, wanted)
                tg.start_soon(ask, unwanted)
                await until(lambda: len(queue.pending()) == 2)
                # The long-poll wakes for the new requests.
                state = (await http.get(f"/ui/state?after={version}")).json()
                assert state["version"] != version
                section = state["bot-requests"]
                assert f"An agent asks to add bot {wanted}: " in section
                assert f"An agent asks to add bot {unwanted}: " in section
                assert "<script>" not in section
                assert "<img" not in section
                assert "&lt;script&gt;" in section
                assert "from agent claude-code 2.1" in section
                by_uid = {r.uid: r.id for r in queue.pending()}
                assert f'action="/ui/bot-requests/{by_uid[wanted]}/approve"' in section
                # A decision needs the CSRF token.
                forged = await http.post(f"/ui/bot-requests/{by_uid[wanted]}/approve")
                assert forged.status_code == 403
                assert len(queue.pending()) == 2
                json_headers = {"X-CSRF-Token": csrf, "Accept": "application/json"}
                approved = await http.post(f"/ui/bot-requests/{by_uid[wanted]}/approve", headers=json_headers)
                assert approved.status_code == 200, approved.text
                assert approved.json() == {
                    "id": by_uid[wanted],
                    "outcome": "approved",
                    "message": f"Approved: the agent's request to add bot {wanted}; outcome: approved",
                }
                # Without the script: the form posts and lands back on the page.
                denied = await http.post(f"/ui/bot-requests/{by_uid[unwanted]}/deny", data={"csrf": csrf})
                assert denied.status_code == 303
            assert answers[wanted].outcome == "approved"
            assert answers[unwanted].outcome == "denied"
            assert _allowed(env) == (BOT, wanted)
            # Deciding again is refused with the admin route's reason; an unknown id is a 404.
            late = await http.post(f"/ui/bot-requests/{by_uid[unwanted]}/approve", headers=json_headers)
            assert late.status_code == 409
            assert "already ended (denied)" in late.json()["error"]
            page_late = await http.post(f"/ui/bot-requests/{by_uid[unwanted]}/approve", data={"csrf": csrf})
            assert page_late.status_code == 409
            assert "already ended (denied)" in page_late.text
            unknown = await http.post("/ui/bot-requests/0123456789abcdef/deny", headers=json_headers)
            assert unknown.status_code == 404
            assert _allowed(env) == (BOT, wanted)
            section = (await http.get("/ui/state")).json()["bot-requests"]
            assert "No agent asks to add a bot." in section
            assert f"Bot <code>{wanted}</code>: approved" in section
            assert f"Bot <code>{unwanted}</code>: denied" in section


async def test_a_bridge_without_add_bot_requests_shows_no_such_section(tmp_path: Path) -> None:
    from brmcp.bridge.admin.ui import ui_handler
    from brmcp.bridge.base import send_json

    async def no_requests(scope: Any, receive: Any, send: Any, path: str) -> None:
        await send_json(send, 404, {"error": "not found"})

    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            env.bridge._app._ui = ui_handler(env.bridge, admin=no_requests)
            await _login(env, http)
            page = await http.get("/ui/")
            assert page.status_code == 200
            assert '<section id="bot-requests"></section>' in page.text
            assert "Add-bot requests" not in page.text
            state = await http.get("/ui/state")
            assert state.status_code == 200
            assert state.json()["bot-requests"] == ""


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=30,
)
_ROW_KEYS = (
    "id",
    "uid",
    "reason",
    "via",
    "agent",
    "requestedAt",
    "expiresAt",
    "contact",
    "outcome",
    "endedAt",
)
_MARKUP = st.sampled_from(
    ['<img src=x onerror="alert(1)">', "</li><script>x()</script>", "\u202e\x1b[2J", "a&b"]
)
_ROW = st.fixed_dictionaries({}, optional=dict.fromkeys(_ROW_KEYS, _JSON | _MARKUP))


@given(
    answer=_JSON
    | st.fixed_dictionaries({"pending": st.lists(_ROW, max_size=30), "recent": st.lists(_ROW, max_size=30)})
)
@hypothesis_settings(max_examples=200, deadline=None)
def test_any_bot_requests_answer_renders_bounded_and_escaped(answer: Any) -> None:
    from brmcp.bridge.admin.ui import (
        BOT_REQUEST_ROWS,
        MAX_REQUEST_TEXT,
        bot_requests_from_json,
        render_bot_requests,
    )

    requests = bot_requests_from_json(answer)
    html_text = render_bot_requests(requests, "csrf", START, {})
    if requests is None:
        assert html_text == ""
        return
    assert len(requests.pending) <= BOT_REQUEST_ROWS
    assert len(requests.recent) <= BOT_REQUEST_ROWS
    for r in requests.pending:
        assert len(r.reason) <= MAX_REQUEST_TEXT
        assert r.reason.isprintable()
        assert f"/ui/bot-requests/{html.escape(r.id)}/approve" in html_text
    assert "<script" not in html_text
    assert "<img" not in html_text
    assert html_text.count("<form") == 2 * len(requests.pending)
