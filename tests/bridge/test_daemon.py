"""brmcp-bridge end to end: an SDK streamable-HTTP client calls a paid tool of
a brmcp-serve bot through the daemon, across the fake relay (payment_required
-> TipUser -> tip progress confirms -> the bot is credited from its TipStream
-> the reissue with the same callKey succeeds); the CLI subcommands against
the running daemon; the TipPayer's failures; late tip outcomes; and the
console command (SIGHUP reload of a disabled bridge, SIGTERM)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brmcp.bridge import BridgeDaemon, BridgeError, Settings, TipMatcher, TipPayer, TipPaymentError
from brmcp.bridge.cli import main
from brmcp.bridge.daemon import RUNTIME_FILE, read_runtime, resolve_listen
from brmcp.bridge.links import no_answer_hint
from brmcp.clientrpc import write_bot_config
from brmcp.testing.fakebr import KIND_PM, KIND_TIP_PROGRESS, FakeBRClient, TipFailure, ensure_brclient_certs
from tests.kit.clientrpc import FAST, fake_network
from tests.kit.serve import ServeEnv, serve_network, until

TOKEN = "agent-token-0123456789abcdef"
OTHER_DATADIR = "if the daemon runs with another data directory, add --datadir DIR to this command"


class FastPollClock:
    """Wall time, with the bridge's 3 s credit polls shortened to 0.25 s."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(min(max(seconds, 0.0), 0.25))


def bridge_settings(bot: str, **changes: Any) -> Settings:
    base = Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=20_000,
        per_day_cap_atoms=100_000,
        allowed_bots=(bot,),
    )
    return base.replace(**changes)


def prepare_bridge_dir(datadir: Path, user: FakeBRClient, settings: Settings | None) -> None:
    datadir.mkdir(parents=True, exist_ok=True)
    write_bot_config(datadir / "brmcp-bridge.conf", user.bot_config(datadir, "brmcp-bridge"))
    if settings is not None:
        (datadir / "mcpclient.json").write_text(settings.to_json())


@contextlib.asynccontextmanager
async def running_daemon(
    env: ServeEnv, datadir: Path, settings: Settings | None
) -> AsyncIterator[BridgeDaemon]:
    prepare_bridge_dir(datadir, env.alice, settings)
    daemon = BridgeDaemon.from_datadir(
        datadir, listen="127.0.0.1:0", clock=FastPollClock(), client_options=FAST
    )
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        await daemon.client.wait_connected()
        yield daemon
        tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def agent(url: str, token: str = TOKEN) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def cli(*argv: str) -> tuple[int, str, str]:
    """Run the CLI's main() in a worker thread; returns (status, stdout, stderr)."""

    def run() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(list(argv))
        return status, out.getvalue(), err.getvalue()

    return await anyio.to_thread.run_sync(run)


async def test_paid_call_through_the_daemon_and_the_cli(tmp_path: Path) -> None:
    with anyio.fail_after(120):
        async with serve_network(tmp_path) as env:
            bot, alice, harness = env.bot, env.alice, env.app.harness
            datadir = tmp_path / "bridge"
            async with running_daemon(env, datadir, bridge_settings(bot.uid)) as daemon:
                url = f"{daemon.base_url}/mcp/{bot.uid}"
                async with agent(url) as s:
                    tools = {t.name: t for t in (await s.list_tools()).tools}
                    assert tools["fortune"].meta == {"brmcp/priceAtoms": 10_000}
                    result = await s.call_tool("fortune", {})
                    assert not result.is_error, result
                    assert result.structured_content is not None
                    assert "fortune" in result.structured_content

                # The bridge tipped once, through brclient's TipUser (DCR float, 3 attempts).
                tips = [p for m, p in alice.requests if m == "PaymentsService.TipUser"]
                assert tips == [{"user": bot.uid, "dcrAmount": 0.0001, "maxAttempts": 3}]
                spend = daemon.bridge.spend_log()
                assert [(e.bot, e.tool, e.atoms, e.status) for e in spend.entries] == [
                    (bot.uid, "fortune", 10_000, "paid")
                ]
                assert spend.day_total_atoms == 10_000
                # The bot was credited from its TipStream and charged once.
                statement = await harness.statement(alice.uid)
                assert [(e.kind, e.atoms) for e in statement] == [("tip", 10_000), ("charge", -10_000)]
                assert len({e.call_key for e in statement if e.kind == "charge"}) == 1
                await alice.wait_for(lambda: alice.pending_events(KIND_TIP_PROGRESS) == [])
                await alice.wait_for(lambda: alice.pending_events(KIND_PM) == [])

                record = read_runtime(datadir)
                assert record is not None
                assert record["pid"] == os.getpid()
                assert record["url"] == daemon.base_url
                d = str(datadir)

                status, out, _ = await cli("--datadir", d, "--json", "settings", "--show-token")
                assert status == 0
                assert json.loads(out) == bridge_settings(bot.uid).to_dict()
                status, out, err = await cli("--datadir", d, "settings")
                assert (status, err) == (0, "")  # from the daemon: no note
                shown = json.loads(out)
                assert shown["mode"] == "autopay"
                assert shown["token"] == "<hidden>"  # the agents' token only on request
                assert TOKEN not in out

                # The admin API refuses a mode it does not know (loading a file
                # would read it as approval); so does the CLI, before asking.
                async with httpx2.AsyncClient(timeout=30) as http:
                    admin_token = (datadir / "mcpadmin.token").read_text().strip()
                    refused = await http.put(
                        f"{daemon.base_url}/admin/settings",
                        json={"mode": "autopy"},
                        headers={"Authorization": f"Bearer {admin_token}"},
                    )
                assert refused.status_code == 400
                assert refused.json() == {"error": 'mode must be "approval" or "autopay", not "autopy"'}
                assert daemon.bridge.settings.mode == "autopay"
                status, _, err = await cli("--datadir", d, "settings", "set", "mode=autopy")
                assert status == 1
                assert err.strip() == "brmcp-bridge: mode='autopy': use approval or autopay"

                status, out, _ = await cli("--datadir", d, "--json", "spend")
                assert status == 0
                assert json.loads(out) == spend.to_dict()
                status, out, _ = await cli("--datadir", d, "spend")
                assert status == 0
                assert "fortune" in out
                assert "paid" in out
                assert "spent in the last 24 hours: 10,000 atoms" in out

                status, out, _ = await cli("--datadir", d, "config-snippet", bot.uid.upper())
                assert status == 0
                assert f'"url": "{url}"' in out
                assert f'"Authorization": "Bearer {TOKEN}"' in out
                assert f"claude mcp add --transport http brmcp-{bot.uid[:8]} {url}" in out
                assert f'--header "Authorization: Bearer {TOKEN}"' in out
                status, _, err = await cli("--datadir", d, "config-snippet", "zz")
                assert status == 1
                assert "not 64 hex" in err

                status, out, _ = await cli("--datadir", d, "approvals")
                assert (status, out.strip()) == (0, "no payments waiting for approval")

                # Approval mode: the next paid call parks until approved from the CLI.
                status, out, _ = await cli(
                    "--datadir", d, "--json", "settings", "set", "mode=Approval", "per_call_cap_atoms=15000"
                )
                assert status == 0, out
                assert json.loads(out)["mode"] == "approval"
                assert json.loads(out)["token"] == "<hidden>"
                assert daemon.bridge.settings.per_call_cap_atoms == 15_000
                outcome: dict[str, Any] = {}
                async with agent(url) as s, anyio.create_task_group() as tg:

                    async def paid_call() -> None:
                        outcome["result"] = await s.call_tool("fortune", {})

                    tg.start_soon(paid_call)
                    await until(lambda: len(daemon.bridge.pending_payments()) == 1)
                    status, out, _ = await cli("--datadir", d, "--json", "approvals")
                    pending = json.loads(out)["pending"]
                    assert status == 0
                    assert len(pending) == 1
                    assert (pending[0]["bot"], pending[0]["tool"], pending[0]["atoms"]) == (
                        bot.uid,
                        "fortune",
                        10_000,
                    )
                    status, out, _ = await cli("--datadir", d, "approvals")
                    assert pending[0]["id"] in out
                    header, row = out.splitlines()
                    assert header.endswith("CREATED (UTC)")
                    created = datetime.fromtimestamp(pending[0]["created"], UTC).strftime("%Y-%m-%d %H:%M:%S")
                    assert row.endswith(f"  10,000  {created}")
                    # The spend log has nothing yet, and says what is waiting.
                    status, out, _ = await cli("--datadir", d, "spend")
                    assert status == 0
                    assert out.splitlines()[-1] == (
                        "waiting for your approval: 1 payment(s), 10,000 atoms in all (not paid yet); "
                        f"see them with: brmcp-bridge --datadir {d} approvals"
                    )
                    status, _, err = await cli("--datadir", d, "approvals", "approve", "no-such-id")
                    assert status == 1
                    assert err.count("\n") == 1
                    assert "unknown payment 'no-such-id'" in err
                    assert err.rstrip().endswith(f"list them with: brmcp-bridge --datadir {d} approvals")
                    status, _, err = await cli("--datadir", d, "approvals", "deny")
                    assert status == 1
                    assert f"needs a payment ID; list them with: brmcp-bridge --datadir {d} approvals" in err
                    status, out, _ = await cli("--datadir", d, "approvals", "approve", pending[0]["id"])
                    assert (status, out.strip()) == (0, f"approved {pending[0]['id']}")
                assert not outcome["result"].is_error
                assert daemon.bridge.spend_log().day_total_atoms == 20_000

                status, _, err = await cli("--datadir", d, "settings", "set", "allowed_bots=nothex")
                assert status == 1
                assert 'allowed bot "nothex" is not a 64-hex uid' in err
                status, _, err = await cli("--datadir", d, "settings", "set", "colour=blue")
                assert status == 1
                assert "unknown setting 'colour'" in err
                status, _, err = await cli("--datadir", d, "settings", "set", "per_day_cap_atoms=lots")
                assert status == 1
                assert "not an integer number of atoms" in err

                token_file = datadir / "mcpadmin.token"
                token_file.rename(datadir / "moved.token")
                status, _, err = await cli("--datadir", d, "spend")
                assert status == 1
                assert f"admin token file {token_file} is missing" in err
                (datadir / "moved.token").write_text("f" * 32 + "\n")
                token_file.unlink(missing_ok=True)
                (datadir / "moved.token").rename(token_file)
                status, _, err = await cli("--datadir", d, "spend")
                assert status == 1
                assert "refused the admin token" in err
            assert not (datadir / RUNTIME_FILE).exists()
            # Stopped: spend and settings come from the files, and say so.
            status, out, err = await cli("--datadir", str(datadir), "spend")
            assert status == 0
            assert err.strip() == (
                f"brmcp-bridge: the daemon is not running (no {datadir / RUNTIME_FILE}); "
                f"read from {datadir / 'mcpspend.json'} ({OTHER_DATADIR})"
            )
            assert "spent in the last 24 hours: 20,000 atoms" in out
            status, _, err = await cli("--datadir", str(datadir), "approvals")
            assert status == 1
            assert err.strip() == (
                "brmcp-bridge: approvals live in the running daemon's memory, and it is not running "
                f"(no {datadir / RUNTIME_FILE}); start it with: brmcp-bridge --datadir {datadir} "
                f"({OTHER_DATADIR})"
            )
            status, _, err = await cli("--datadir", str(datadir), "config-snippet", bot.uid)
            assert status == 1
            assert f"the daemon is not running (no {datadir / RUNTIME_FILE})" in err


async def test_late_tip_outcome_settles_a_pending_spend(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with serve_network(tmp_path) as env:
            datadir = tmp_path / "bridge"
            datadir.mkdir()
            pending = [
                {"ts": int(time.time()) - 60, "bot": env.bot.uid, "tool": "fortune", "rail": "tip"}
                | {"atoms": 10_000, "status": "pending"}
            ]
            (datadir / "mcpspend.json").write_text(json.dumps(pending, indent=2))
            async with running_daemon(env, datadir, bridge_settings(env.bot.uid)) as daemon:
                # A terminal event nobody waits for (e.g. confirmed after a restart).
                env.alice.emit_tip_progress(env.bot.uid, 10_000_000, completed=True, attempt=2)
                await until(lambda: daemon.bridge.spend_log().entries[0].status == "paid")
                await env.alice.wait_for(lambda: env.alice.pending_events(KIND_TIP_PROGRESS) == [])
                assert daemon.late_outcomes == 1
                # A retried attempt is not terminal: nothing is resolved, it is acked.
                env.alice.emit_tip_progress(
                    env.bot.uid, 5_000_000, attempt=1, attempt_err="x", will_retry=True
                )
                await env.alice.wait_for(lambda: env.alice.pending_events(KIND_TIP_PROGRESS) == [])
                assert daemon.late_outcomes == 1


async def test_tip_payer_reports_refusals_and_failures(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with (
            fake_network(tmp_path, "bot", "alice", "stranger", contacts=False) as (
                relay,
                (bot, alice, stranger),
            ),
            alice.client(**FAST) as client,
            anyio.create_task_group() as tg,
        ):
            relay.kx(bot, alice)
            matcher = TipMatcher()
            payer = TipPayer(client, matcher, reconnect_wait=0)
            with pytest.raises(TipPaymentError, match=r"^brclient not connected$"):
                await payer.pay(bot.uid, 100)  # not connected yet (and told not to wait)
            await client.wait_connected()
            progress = client.tip_progress()

            async def feed() -> None:
                async for ev in progress:
                    if ev.final:
                        matcher.resolve(ev.uid, ev.amount_matoms, None if ev.completed else ev.attempt_err)

            tg.start_soon(feed)
            await payer.pay(bot.uid.upper(), 1_234)  # completes
            with pytest.raises(TipPaymentError, match=f"^tip: user {stranger.uid} not found$"):
                await payer.pay(stranger.uid, 100)
            alice.fail_next_tip(TipFailure(attempts=3, error="no route to bot"))
            with pytest.raises(TipPaymentError, match=r"^tip failed: no route to bot$"):
                await payer.pay(bot.uid, 500)
            with pytest.raises(TipPaymentError, match="cannot tip 0 atoms"):
                await payer.pay(bot.uid, 0)
            assert matcher.waiting() == 0
            tg.cancel_scope.cancel()


async def test_reload_logs_the_endpoint_and_survives_a_taken_port(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    with anyio.fail_after(60):
        async with fake_network(tmp_path / "br", "bot", "alice") as (_, (bot, alice)):
            datadir = tmp_path / "bridge"
            prepare_bridge_dir(datadir, alice, None)
            daemon = BridgeDaemon.from_datadir(datadir, listen="127.0.0.1:0", client_options=FAST)
            host, port = daemon.listen.rsplit(":", 1)
            settings_file = datadir / "mcpclient.json"
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                assert "bridge disabled, no endpoint" in caplog.text
                # Enabled while another program holds the port: the settings are
                # in force, the bind failure is logged, and the daemon keeps running.
                settings_file.write_text(bridge_settings(bot.uid).to_json())
                with socket.socket() as squatter:
                    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    squatter.bind((host, int(port)))
                    squatter.listen(1)
                    caplog.clear()
                    reloaded = await daemon.reload()
                assert reloaded.enabled
                assert daemon.bridge.settings.enabled
                assert "reloaded settings: enabled=true mode=autopay" in caplog.text
                assert f"the endpoint could not be opened: listen {daemon.listen}" in caplog.text
                command = f"brmcp-bridge --datadir {datadir}"
                assert f"start it as {command} --listen 127.0.0.1:<free port> to pick another" in caplog.text
                assert daemon.bridge.listen_address is None
                # The next reload opens it, and says where.
                caplog.clear()
                await daemon.reload()
                assert daemon.bridge.listen_address == (host, int(port))
                assert f"bridge enabled: endpoint open at {daemon.base_url}/mcp/<bot uid>" in caplog.text
                # A malformed file is refused and changes nothing.
                settings_file.write_text("{")
                with pytest.raises(BridgeError, match="parse "):
                    await daemon.reload()
                assert daemon.bridge.listen_address == (host, int(port))
                settings_file.write_text(bridge_settings(bot.uid, enabled=False).to_json())
                caplog.clear()
                await daemon.reload()
                assert f"bridge disabled: endpoint {daemon.base_url} closed" in caplog.text
                assert daemon.bridge.listen_address is None
                tg.cancel_scope.cancel()


async def test_console_daemon_on_a_taken_port_says_to_use_listen(tmp_path: Path) -> None:
    """Enabled, and another program holds the endpoint's port: brmcp-bridge
    exits 1 with one line naming the address and the --listen option."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with anyio.fail_after(60):
        async with fake_network(tmp_path / "br", "bot", "alice") as (_, (bot, alice)):
            datadir = tmp_path / "bridge"
            prepare_bridge_dir(datadir, alice, bridge_settings(bot.uid))
            with socket.socket() as squatter:
                squatter.bind(("127.0.0.1", 0))
                squatter.listen(1)
                listen = f"127.0.0.1:{squatter.getsockname()[1]}"
                cmd = [sys.executable, "-m", "brmcp.bridge", "--datadir", str(datadir), "--listen", listen]
                done = await anyio.run_process(cmd, env=env, check=False)
            assert done.returncode == 1
            last = done.stderr.decode().strip().splitlines()[-1]
            assert last.startswith(f"brmcp-bridge: listen {listen}: ")
            assert "in use" in last
            assert "--listen 127.0.0.1:<free port>" in last
            assert "brmcp-bridge.conf has no key for it" in last


def test_resolve_listen_pins_a_free_port() -> None:
    address = resolve_listen("127.0.0.1:0")
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1"
    assert int(port) > 0
    assert resolve_listen("[::1]:8891") == "[::1]:8891"
    for bad in ("0.0.0.0:8891", "example.com:1", "127.0.0.1"):
        with pytest.raises(ValueError):
            resolve_listen(bad)


async def _read_until(proc: anyio.abc.Process, buffer: bytearray, needle: bytes) -> None:
    assert proc.stderr is not None
    while needle not in buffer:
        buffer.extend(await proc.stderr.receive())


async def test_console_daemon_enabled_by_the_cli_via_sighup(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with anyio.fail_after(120):
        async with fake_network(tmp_path / "br", "bot", "alice") as (_, (bot, alice)):
            datadir = tmp_path / "bridge"
            prepare_bridge_dir(datadir, alice, None)  # no mcpclient.json: disabled
            d = str(datadir)
            status, out, err = await cli("--datadir", d, "settings")
            assert status == 0
            assert json.loads(out) == Settings().to_dict()
            assert "the daemon is not running" in err
            assert f"{datadir / 'mcpclient.json'} does not exist yet (defaults shown)" in err
            listen = resolve_listen("127.0.0.1:0")
            cmd = [sys.executable, "-m", "brmcp.bridge", "--datadir", d, "--listen", listen]
            async with await anyio.open_process(cmd, env=env, stderr=subprocess.PIPE) as proc:
                try:
                    log = bytearray()
                    await _read_until(proc, log, f"as alice (uid {alice.uid})".encode())
                    await _read_until(proc, log, b"bridge disabled")
                    await until(lambda: read_runtime(datadir) is not None)
                    # Disabled: no admin surface; spend and settings come from the files.
                    status, out, err = await cli("--datadir", d, "spend")
                    assert (status, out) == (0, "no payments yet\nspent in the last 24 hours: 0 atoms\n")
                    assert "the bridge is disabled, so the daemon's admin surface is off" in err
                    status, _, err = await cli("--datadir", d, "approvals")
                    assert status == 1
                    assert "off while the bridge is disabled; enable it with" in err

                    argv: Sequence[str] = ("--datadir", d, "--json", "settings", "set", "enabled=true")
                    status, out, err = await cli(
                        *argv, f"allowed_bots={bot.uid}", "mode=autopay", "--show-token"
                    )
                    assert status == 0, err
                    assert "sent SIGHUP" in err
                    applied = json.loads(out)
                    assert applied["enabled"] is True
                    assert applied["allowed_bots"] == [bot.uid]
                    assert len(applied["token"]) == 32  # minted when enabling without one
                    # The reload logs the endpoint, as a start while enabled does.
                    await _read_until(proc, log, b"reloaded settings: enabled=true")
                    await _read_until(proc, log, f"endpoint open at http://{listen}/mcp/<bot uid>".encode())
                    status, out, _ = await cli("--datadir", d, "--json", "settings", "--show-token")
                    assert status == 0
                    assert json.loads(out) == applied
                    status, out, _ = await cli("--datadir", d, "config-snippet", bot.uid)
                    assert status == 0
                    assert f"http://{listen}/mcp/{bot.uid}" in out

                    # Disabling through the admin surface closes it, and says so.
                    status, out, _ = await cli("--datadir", d, "--json", "settings", "set", "enabled=false")
                    assert status == 0
                    assert json.loads(out)["enabled"] is False
                    await _read_until(proc, log, f"bridge disabled: endpoint http://{listen} closed".encode())
                    proc.send_signal(signal.SIGTERM)
                    assert await proc.wait() == 0
                finally:
                    if proc.returncode is None:
                        proc.kill()
            assert not (datadir / RUNTIME_FILE).exists()
            saved = Settings(**json.loads((datadir / "mcpclient.json").read_text()))
            assert saved.enabled is False
            assert saved.mode == "autopay"
            # brmcp-bridge.conf names a log file (bisonbotkit's default): the log went there too.
            logfile = datadir / "logs" / "brmcp-bridge.log"
            assert stat.S_IMODE(logfile.parent.stat().st_mode) == 0o700
            assert stat.S_IMODE(logfile.stat().st_mode) == 0o600
            logged = logfile.read_text()
            assert f"endpoint open at http://{listen}/mcp/<bot uid>" in logged
            assert f"bridge disabled: endpoint http://{listen} closed" in logged

            # Killed with SIGKILL, the daemon leaves its runtime file behind; the
            # subcommands see that no process owns it any more.
            async with await anyio.open_process(cmd, env=env, stderr=subprocess.PIPE) as proc:
                try:
                    await until(lambda: (read_runtime(datadir) or {}).get("pid") == proc.pid)
                    proc.kill()
                    await proc.wait()
                finally:
                    if proc.returncode is None:
                        proc.kill()
            runtime = datadir / RUNTIME_FILE
            assert runtime.exists()
            stale = f"stale runtime file {runtime}: process {proc.pid} is gone"
            status, out, err = await cli("--datadir", d, "spend")
            assert status == 0
            assert err.strip() == (
                f"brmcp-bridge: the daemon is not running ({stale}); "
                f"{datadir / 'mcpspend.json'} does not exist yet (nothing was paid) ({OTHER_DATADIR})"
            )
            assert out.startswith("no payments yet\n")
            status, _, err = await cli("--datadir", d, "approvals")
            assert status == 1
            assert stale in err


def test_daemon_reports_bad_configuration_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    datadir = tmp_path / "bridge"
    # First run: the templates are written and the next steps printed (like brmcp-serve).
    assert main(["--datadir", str(datadir)]) == 0
    first = capsys.readouterr()
    conf = datadir / "brmcp-bridge.conf"
    assert first.out.startswith(f"brmcp-bridge: created {conf}, {datadir / 'mcpclient.json'}\n")
    assert f"brmcp-bridge --datadir {datadir} settings set enabled=true allowed_bots=<bot uid>" in first.out
    assert f"Then start it: brmcp-bridge --datadir {datadir}" in first.out
    assert first.err == ""
    assert conf.is_file()
    assert json.loads((datadir / "mcpclient.json").read_text())["enabled"] is False
    assert stat.S_IMODE((datadir / "mcpclient.json").stat().st_mode) == 0o600
    # Second run: the missing brclient files are named in one line.
    assert main(["--datadir", str(datadir)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    err = lines[-1]
    assert err.startswith("brmcp-bridge: ")
    assert str(tmp_path / "home" / ".brclient" / "rpc.cert") in err
    assert "brmcp-bridge.conf" in err
    # With brclient's files in place, a malformed mcpclient.json is named.
    ensure_brclient_certs(tmp_path / "home" / ".brclient")
    (datadir / "mcpclient.json").write_text('{"enabled": "yes"}')
    assert main(["--datadir", str(datadir)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"brmcp-bridge: parse {datadir / 'mcpclient.json'}: " in err
    assert main(["--datadir", str(datadir), "--listen", "0.0.0.0:1"]) == 1
    assert "loopback" in capsys.readouterr().err
    # A log file that cannot be opened is one line naming it.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    conf.write_text(conf.read_text().replace(str(datadir / "logs"), str(blocker)))
    assert main(["--datadir", str(datadir)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"brmcp-bridge: cannot open log file {blocker / 'brmcp-bridge.log'}: not a directory"
    )
    assert err.rstrip().endswith(f"(logfile in {conf})")


@pytest.mark.parametrize("holds", [True, False], ids=["bot-holds", "bot-refuses-at-once"])
async def test_tip_that_cannot_complete_ends_the_wait_at_once(tmp_path: Path, holds: bool) -> None:
    """The first TipProgress says the attempt failed and
    brclient retries later (a payee without a wallet): the paid call ends
    now with a clear note, not after tip_wait_secs; the spend stays pending
    with the reason, and the late terminal event settles it. The tip was
    made alongside the first send (WIRE.md §Pay alongside): a bot that
    holds the marked call has it withdrawn and answers the unmarked copy at
    once, as a bot that does not hold (the Go reference) does; the late
    credit stays at the bot, nothing is charged."""
    with anyio.fail_after(120):
        async with serve_network(tmp_path) as env:
            if not holds:
                env.app.harness.config.hold_seconds = 0
            bot, alice = env.bot, env.alice
            datadir = tmp_path / "bridge"
            settings = bridge_settings(bot.uid, tip_wait_secs=600)
            async with running_daemon(env, datadir, settings) as daemon:
                url = f"{daemon.base_url}/mcp/{bot.uid}"
                wallet_error = (
                    "milliatoms requested in invoice (0) different than milliatoms originally requested"
                )
                alice.fail_next_tip(TipFailure(attempts=1, error=wallet_error, delay=0.5))
                started = time.monotonic()
                async with agent(url) as s:
                    result = await s.call_tool("fortune", {})
                # Well under the bot's 30 s hold, let alone tip_wait_secs.
                assert time.monotonic() - started < 20
                note = result.content[-1]
                assert note.type == "text"
                assert note.text == (
                    f"brmcp-bridge: payment not made: tip cannot complete now: {wallet_error}; brclient"
                    " retries it later, so it may still land (the spend log records it)"
                )
                # The tip may still land: pending, counted against the day cap.
                entry = daemon.bridge.spend_log().entries[0]
                assert (entry.atoms, entry.status) == (10_000, "pending")
                assert wallet_error in entry.err
                assert "may still land" in entry.err
                # brclient's retry then completes: the late outcome settles the entry.
                await until(lambda: daemon.bridge.spend_log().entries[0].status == "paid")
                assert daemon.late_outcomes == 1
                # The books: the 10,000 atoms landed as credit at the bot and
                # nothing was charged for the call the agent did not get.
                await until(lambda: _balance_is(env, alice.uid, 10_000))
                statement = await env.app.harness.statement(alice.uid)
                assert [e.kind for e in statement] == ["tip"]
                assert sum(e.atoms for e in statement) == 10_000


async def _balance_is(env: ServeEnv, peer: str, atoms: int) -> bool:
    return await env.app.harness.balance(peer) == atoms


async def test_tip_payer_waits_for_a_reconnect(tmp_path: Path) -> None:
    """A payment made while the clientrpc link reconnects waits
    for it (bounded) instead of failing with "brclient not connected"."""
    with anyio.fail_after(60):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_relay, (bot, alice)),
            alice.client(**FAST) as client,
            anyio.create_task_group() as tg,
        ):
            matcher = TipMatcher()
            payer = TipPayer(client, matcher, reconnect_wait=30)
            await client.wait_connected()
            progress = client.tip_progress()

            async def feed() -> None:
                async for ev in progress:
                    if ev.final:
                        matcher.resolve(ev.uid, ev.amount_matoms, None if ev.completed else ev.attempt_err)

            tg.start_soon(feed)
            alice.drop_connections()
            await until(lambda: not client.connected)
            await payer.pay(bot.uid, 1_234)  # waits for the reconnect, then pays
            assert client.connections >= 2
            tips = [p for m, p in alice.requests if m == "PaymentsService.TipUser"]
            assert len(tips) == 1
            tg.cancel_scope.cancel()


async def test_the_no_answer_hint_names_the_daemon_s_own_uid(tmp_path: Path) -> None:
    """The hint an agent gets from a bot that never answers names this
    daemon's uid (as brclient reports it), not a placeholder."""
    with anyio.fail_after(60):
        async with (
            serve_network(tmp_path, allowed=[]) as env,
            running_daemon(env, tmp_path / "bridge", bridge_settings(env.bot.uid)) as daemon,
        ):
            await until(lambda: daemon.bridge._own_uid == env.alice.uid, 10)
            link = daemon.bridge._proxy(env.bot.uid).link
            hint = no_answer_hint(env.bot.uid, 30, link.own_uid)
            assert f"is your uid {env.alice.uid} on its allowed_uids?" in hint
            assert "(this bridge's uid)" not in hint
