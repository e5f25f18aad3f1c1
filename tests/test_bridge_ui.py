"""The approvals page over plain HTTP (no browser): one-time login links
minted with the admin token, the session cookie, CSRF on every decision,
escaping of what bots send, the long-poll, the no-script form flow, and the
daemon's approval notification command."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from bridge_support import BOT, TOKEN, Env, bridge_env, call, fixture_settings, until

from brmcp.bridge.approvals import PendingPayment
from brmcp.bridge.cli import main as bridge_main
from brmcp.bridge.daemon import BridgeDaemon
from brmcp.bridge.spend import BotBalance, SpendEntry, SpendSummary
from brmcp.bridge.ui import UISessions
from brmcp.bridge.ui.pages import PageState, render_page


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
            assert "brmcp-bridge ui" in no_session.text
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
                tg.start_soon(poll)
                await anyio.sleep(0.2)
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
            gone = await http.post(base, headers={"X-CSRF-Token": csrf, "Accept": "application/json"})
            assert gone.status_code == 404
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
                    tg.start_soon(call, session, "paid", {"text": "x", "count": 1})
                    await until(lambda: out.exists() and out.read_text().count("\n") == 1)
                    (pending,) = env.bridge.pending_payments()
                    env.bridge.resolve_payment(pending.id, False)
                    await until(lambda: not env.bridge.pending_payments())
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
    from brmcp.bridge import _command

    monkeypatch.setattr(_command, "default_datadir", lambda: tmp_path / "default")
    assert _command.cli_command(tmp_path / "default") == "brmcp-bridge"
    assert _command.cli_command(tmp_path / "other") == f"brmcp-bridge --datadir {tmp_path / 'other'}"
    spaced = tmp_path / "my bridge"
    assert _command.cli_command(spaced) == f"brmcp-bridge --datadir '{spaced}'"
    settings = fixture_settings()
    state = PageState(settings, (), SpendSummary((), 0), {}, now=0, version=1)
    assert "<code>brmcp-bridge settings set KEY=VALUE</code>" in render_page(state, "csrf")


def test_bridge_md_explains_agent_timeouts_in_approval_mode() -> None:
    text = (Path(__file__).resolve().parent.parent / "BRIDGE.md").read_text()
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
