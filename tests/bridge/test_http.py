"""The bridge's HTTP gate, settings hot-apply and listener lifecycle
(BRIDGE.md §Settings, §Security model; the Go reference's ``bridge/http_test.go``), plus the hardening
on top of the reference: DNS-rebinding checks, batch rejection and hostile
requests."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from brmcp.bridge import Bridge, BridgeConfig, BridgeError, Settings, SettingsError
from brmcp.testing import Fabric
from tests.kit.bridge import (
    BOT,
    CLIENT,
    INIT,
    MCP_HEADERS,
    OTHER_BOT,
    TOKEN,
    TestPayer,
    auth,
    bridge_env,
    call,
    fixture_settings,
)


async def test_bearer_and_path_gate(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            path = f"/mcp/{BOT}"
            no_token = await http.post(path, json=INIT, headers=MCP_HEADERS)
            assert no_token.status_code == 401
            assert no_token.headers["x-content-type-options"] == "nosniff"
            wrong = await http.post(path, json=INIT, headers=auth("wrong-token"))
            assert wrong.status_code == 401
            assert (await http.post("/elsewhere", json=INIT, headers=MCP_HEADERS)).status_code == 401
            short = await http.post("/mcp/abc123", json=INIT, headers=auth())
            assert (short.status_code, short.text) == (
                404,
                'unknown bot: malformed uid "abc123" in the path'
                " (a bot uid is 64 hex characters: /mcp/<bot uid>)\n",
            )
            zz = await http.post("/mcp/zz", json=INIT, headers=auth())
            assert zz.status_code == 404
            assert zz.text.startswith('unknown bot: malformed uid "zz"')
            assert "64 hex characters" in zz.text
            elsewhere = await http.post("/other", json=INIT, headers=auth())
            assert (elsewhere.status_code, elsewhere.text) == (
                404,
                "unknown bot: the endpoint is /mcp/<bot uid> (64 hex characters)\n",
            )
            unlisted = await http.post(f"/mcp/{OTHER_BOT}", json=INIT, headers=auth())
            assert unlisted.status_code == 404
            for bad in (f"/mcp/{BOT}/", f"/mcp/{BOT}/x", f"/other/{BOT}"):
                assert (await http.post(bad, json=INIT, headers=auth())).status_code == 404
            ok = await http.post(path, json=INIT, headers=auth())
            assert ok.status_code == 200
            upper = await http.post(f"/mcp/{BOT.upper()}", json=INIT, headers=auth())
            assert upper.status_code == 200  # the uid is matched case-insensitively
            # A bare token without the scheme is refused (Go accepts it; BRIDGE.md "Differences").
            raw = await http.post(path, json=INIT, headers={"Authorization": TOKEN, **MCP_HEADERS})
            assert raw.status_code == 401
            await env.bridge.apply_settings(env.bridge.settings.replace(enabled=False))
        # Disabling stopped the owned listener; a mounted app answers 404.
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=env.bridge.asgi_app), base_url="http://127.0.0.1"
        ) as mounted:
            gone = await mounted.post(path, json=INIT, headers=auth())
            assert (gone.status_code, gone.text) == (404, "not found\n")


async def test_empty_token_never_authorizes(tmp_path: Path) -> None:
    data_dir = tmp_path / "bridge"
    data_dir.mkdir()
    (data_dir / "mcpclient.json").write_text(
        json.dumps({"enabled": True, "token": "", "allowed_bots": [BOT]})
    )
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, write_settings=False) as env, env.http() as http:
            assert env.bridge.settings.token == ""
            assert env.bridge.settings.enabled
            path = f"/mcp/{BOT}"
            variants = (MCP_HEADERS, auth("anything"), {"Authorization": "Bearer", **MCP_HEADERS})
            for headers in (*variants, {"Authorization": "", **MCP_HEADERS}):
                assert (await http.post(path, json=INIT, headers=headers)).status_code == 401
            assert json.loads((data_dir / "mcpclient.json").read_text())["token"] == ""


async def test_settings_hot_apply(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, write_settings=False, listen=None) as env:
            bridge = env.bridge
            s = bridge.settings
            assert (s.enabled, s.mode, s.approval_timeout_secs, s.tip_wait_secs) == (
                False,
                "approval",
                120,
                180,
            )
            assert (s.token, s.per_call_cap_atoms, s.per_day_cap_atoms, s.allowed_bots) == ("", 0, 0, None)
            assert not (env.data_dir / "mcpclient.json").exists()

            enabled = await bridge.apply_settings(s.replace(enabled=True, allowed_bots=(BOT,)))
            assert re.fullmatch(r"[0-9a-f]{32}", enabled.token)
            on_disk = (env.data_dir / "mcpclient.json").read_text()
            assert on_disk == enabled.to_json()
            assert (env.data_dir / "mcpclient.json").stat().st_mode & 0o777 == 0o600

            with pytest.raises(SettingsError, match='allowed bot "nothex" is not a 64-hex uid'):
                await bridge.apply_settings(enabled.replace(allowed_bots=(BOT, "nothex")))
            assert bridge.settings == enabled
            assert (env.data_dir / "mcpclient.json").read_text() == on_disk

            bogus = await bridge.apply_settings(enabled.replace(mode="bogus", approval_timeout_secs=-1))
            assert (bogus.mode, bogus.approval_timeout_secs) == ("approval", 120)
            auto = await bridge.apply_settings(bogus.replace(mode="autopay"))
            assert auto.mode == "autopay"

            # An unwritable settings file: the apply fails and rolls back.
            path = env.data_dir / "mcpclient.json"
            path.unlink()
            path.mkdir()
            with pytest.raises(BridgeError, match=r"mcpclient\.json"):
                await bridge.apply_settings(auto.replace(per_call_cap_atoms=5))
            assert bridge.settings == auto
            assert sorted(p.name for p in env.data_dir.iterdir() if p.name.endswith(".tmp")) == []


async def _connect_fails(address: tuple[str, int]) -> bool:
    try:
        stream = await anyio.connect_tcp(*address)
    except OSError:
        return True
    await stream.aclose()
    return False


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_owned_listener_lifecycle(tmp_path: Path) -> None:
    port = _free_port()
    settings = fixture_settings(enabled=False, token="")
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings, listen=f"127.0.0.1:{port}") as env:
            bridge = env.bridge
            assert bridge.listen_address is None
            assert await _connect_fails(("127.0.0.1", port))
            s1 = await bridge.apply_settings(bridge.settings.replace(enabled=True))
            assert bridge.listen_address == ("127.0.0.1", port)
            async with env.session(token=s1.token) as session:
                assert not (await call(session, "free")).is_error
            async with env.http() as http:
                opened = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth(s1.token))
                assert opened.status_code == 200
                sid = opened.headers["mcp-session-id"]
                old_headers = {**auth(s1.token), "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
                async with http.stream("GET", f"/mcp/{BOT}", headers=old_headers) as stream:
                    assert stream.status_code == 200
                    # Rotating the token restarts the listener: the stream opened
                    # under the old token ends.
                    s2 = await bridge.apply_settings(s1.replace(token="rotated-token-000000000000"))
                    with anyio.fail_after(10):
                        async for _ in stream.aiter_raw():
                            pass
            assert bridge.listen_address == ("127.0.0.1", port)
            async with env.http() as http:
                old = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth(s1.token))
                assert old.status_code == 401
                new_headers = {**auth(s2.token), "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
                ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
                assert (await http.post(f"/mcp/{BOT}", json=ping, headers=new_headers)).status_code == 404
                new = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth(s2.token))
                assert new.status_code == 200
            async with env.session(token=s2.token) as session:
                assert not (await call(session, "free")).is_error
            await bridge.apply_settings(s2.replace(enabled=False))
            assert bridge.listen_address is None
            assert await _connect_fails(("127.0.0.1", port))


async def test_listener_bind_error_keeps_settings(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with anyio.fail_after(30):
            async with bridge_env(
                tmp_path, settings=fixture_settings(enabled=False), listen=f"127.0.0.1:{port}"
            ) as env:
                with pytest.raises(BridgeError, match=f"listen 127.0.0.1:{port}"):
                    await env.bridge.apply_settings(env.bridge.settings.replace(enabled=True))
                assert env.bridge.settings.enabled
                assert json.loads((env.data_dir / "mcpclient.json").read_text())["enabled"] is True
                assert env.bridge.listen_address is None


async def test_teardown(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            async with env.session() as session:
                assert not (await call(session, "free")).is_error
            assert env.bridge.router.sessions_of(BOT) == 1
            await env.bridge.apply_settings(env.bridge.settings.replace(allowed_bots=(OTHER_BOT,)))
            assert env.bridge.router.sessions_of(BOT) == 0
            async with env.http() as http:
                response = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
                assert response.status_code == 404
                assert response.text.startswith(f"unknown bot: {BOT} is not on the bridge's allowed_bots")
                # The command that allows it names this bridge's data directory.
                assert (
                    f"allow it with: brmcp-bridge --datadir {env.data_dir} settings set allowed_bots="
                    in response.text
                )
            # PMs from a de-listed bot are dropped by the router's allow check.
            denied = env.bridge.router.stats.dropped_denied
            env.bridge.handle_pm(BOT, "--mcp[v=1,sid=ab,mid=cd,seq=1/1,exp=0]--e30=")
            assert env.bridge.router.stats.dropped_denied == denied + 1
            # Allowed again: a fresh link serves it.
            await env.bridge.apply_settings(env.bridge.settings.replace(allowed_bots=(BOT,)))
            async with env.session() as session:
                assert not (await call(session, "free")).is_error
            await env.bridge.close()
            await env.bridge.close()
            assert env.bridge.closed


async def test_dns_rebinding_rejected(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            path = f"/mcp/{BOT}"
            evil_host = await http.post(path, json=INIT, headers={**auth(), "Host": "evil.example:8891"})
            assert evil_host.status_code == 421
            for origin in ("http://evil.example", "null", "http://127.0.0.1.evil.example", "file://"):
                bad = await http.post(path, json=INIT, headers={**auth(), "Origin": origin})
                assert bad.status_code == 403, origin
            for origin in ("http://localhost:3000", "http://127.0.0.1", "https://[::1]:8443"):
                good = await http.post(path, json=INIT, headers={**auth(), "Origin": origin})
                assert good.status_code == 200, origin
            local = await http.post(path, json=INIT, headers={**auth(), "Host": "localhost:1234"})
            assert local.status_code == 200
            # Rebinding checks run before auth: no token oracle for a foreign page.
            probe = await http.post(path, json=INIT, headers={**MCP_HEADERS, "Host": "evil.example"})
            assert probe.status_code == 421


async def test_batch_rejected_before_reaching_the_bot(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            await call(session, "free")
            before = (env.fabric.stats.pms_sent, dict(env.executions), env.payer.calls[:])
            batch = [
                {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": "tools/call",
                    "params": {"name": "paid", "arguments": {}},
                },
                {
                    "jsonrpc": "2.0",
                    "id": 8,
                    "method": "tools/call",
                    "params": {"name": "paid", "arguments": {}},
                },
            ]
            async with env.http() as http:
                response = await http.post(f"/mcp/{BOT}", json=batch, headers=auth())
            assert response.status_code == 400
            body = response.json()
            assert body["error"]["code"] == -32600
            assert body["id"] is None
            assert (env.fabric.stats.pms_sent, env.executions, env.payer.calls) == before


async def test_hostile_http(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            path = f"/mcp/{BOT}"
            settings_before = (env.data_dir / "mcpclient.json").read_text()
            huge = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * (5 << 20) + b'"}}'
            too_big = await http.post(path, content=huge, headers=auth())
            assert too_big.status_code == 413

            async def chunks() -> Any:
                for _ in range(80):
                    yield b"a" * 65536

            streamed = await http.post(path, content=chunks(), headers=auth())
            assert streamed.status_code == 413
            bad_json = await http.post(path, content=b"{not json", headers=auth())
            assert bad_json.status_code == 400
            assert bad_json.json()["error"]["code"] == -32700
            scalar = await http.post(path, content=b"42", headers=auth())
            assert scalar.status_code == 400
            assert scalar.json()["error"]["code"] == -32600
            no_type = await http.post(
                path, content=json.dumps(INIT), headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert no_type.status_code == 415
            put = await http.put(path, json=INIT, headers=auth())
            assert put.status_code == 405
            assert put.headers["allow"] == "GET, POST, DELETE"
            no_accept = await http.post(
                path,
                json=INIT,
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )
            assert no_accept.status_code < 500  # the SDK decides; nothing may break
            stray = await http.get(path, headers={**auth(), "mcp-session-id": "nope"})
            assert stray.status_code == 404
            delete = await http.delete(path, headers=auth())
            assert 400 <= delete.status_code < 500
            # Nothing changed: no spend, no payment, same settings file, no parked payment.
            assert env.bridge.spend_log().entries == ()
            assert env.payer.calls == []
            assert (env.data_dir / "mcpclient.json").read_text() == settings_before
            assert env.bridge.pending_payments() == []
            # And the endpoint still serves.
            async with env.session() as session:
                assert not (await call(session, "free")).is_error


async def test_modern_era_client(tmp_path: Path) -> None:
    """A 2026-07-28 client (mcp.Client in auto mode) gets the same tools."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
                Client(streamable_http_client(env.url, http_client=http)) as client,
            ):
                tools = await client.list_tools()
                assert {t.name for t in tools.tools} == {"paid", "free", "dyn"}
                result = await client.call_tool("paid", {"text": "x"})
                assert result.structured_content == {"n": 1}
            assert env.payer.calls == [(BOT, 500)]


async def test_mounted_app_without_listener(tmp_path: Path) -> None:
    """listen=None: the host serves bridge.asgi_app (here through httpx's
    ASGI transport); a token change ends the HTTP sessions of the old token."""
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, listen=None) as env:
            assert env.bridge.listen_address is None
            transport = httpx2.ASGITransport(app=env.bridge.asgi_app)
            async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                response = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
                assert response.status_code == 200
                assert "mcp-session-id" in response.headers
                await env.bridge.apply_settings(env.bridge.settings.replace(token="another-token-0123456789"))
                stale = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
                assert stale.status_code == 401


def test_malformed_settings_files(tmp_path: Path) -> None:
    cases = {
        "not json": "{enabled: true",
        "wrong type": '{"per_call_cap_atoms": "500"}',
        "fraction": '{"per_day_cap_atoms": 1.5}',
        "not an object": "[1, 2]",
        "bad uid": json.dumps({"allowed_bots": ["xyz"]}),
        "bad list": '{"allowed_bots": "' + BOT + '"}',
        "nan": '{"per_call_cap_atoms": NaN}',
    }
    for name, content in cases.items():
        data_dir = tmp_path / name.replace(" ", "_")
        data_dir.mkdir()
        path = data_dir / "mcpclient.json"
        path.write_text(content)
        with pytest.raises(BridgeError) as failure:
            _bridge(data_dir)
        assert str(path) in str(failure.value), name
        assert path.read_text() == content  # never rewritten
    spend_dir = tmp_path / "spend"
    spend_dir.mkdir()
    (spend_dir / "mcpspend.json").write_text('[{"ts": "yesterday"}]')
    with pytest.raises(BridgeError, match=r"mcpspend\.json"):
        _bridge(spend_dir)


def test_settings_file_quirks_follow_go(tmp_path: Path) -> None:
    """Keys match case-insensitively, unknown keys are ignored, null keeps
    the default, and nothing is minted on load (BRIDGE.md §Settings)."""
    path = tmp_path / "mcpclient.json"
    path.write_text(
        json.dumps(
            {
                "ENABLED": True,
                "Mode": "autopay",
                "per_call_cap_atoms": 10,
                "unknown": {"x": 1},
                "tip_wait_secs": None,
                "allowed_bots": [BOT.upper()],
                "approval_timeout_secs": 0,
            }
        )
    )
    bridge = _bridge(tmp_path)
    s = bridge.settings
    assert (s.enabled, s.mode, s.per_call_cap_atoms, s.tip_wait_secs, s.approval_timeout_secs) == (
        True,
        "autopay",
        10,
        180,
        120,
    )
    assert s.token == ""
    assert s.allows(BOT)
    assert s.allowed_bots == (BOT.upper(),)


def test_config_validation() -> None:
    payer = TestPayer()
    fabric = Fabric()
    with pytest.raises(ValueError, match="data_dir is required"):
        Bridge(BridgeConfig(data_dir="", sender=fabric.sender(CLIENT), payer=payer))
    with pytest.raises(ValueError, match="loopback"):
        Bridge(
            BridgeConfig(data_dir="/tmp/x", sender=fabric.sender(CLIENT), payer=payer, listen="0.0.0.0:8891")
        )
    with pytest.raises(ValueError, match="host:port"):
        Bridge(BridgeConfig(data_dir="/tmp/x", sender=fabric.sender(CLIENT), payer=payer, listen="8891"))


def _bridge(data_dir: Path) -> Bridge:
    return Bridge(BridgeConfig(data_dir=data_dir, sender=Fabric().sender(CLIENT), payer=TestPayer()))


def test_settings_file_format_matches_go() -> None:
    text = Settings().to_json()
    assert text == (
        "{\n"
        '  "enabled": false,\n'
        '  "token": "",\n'
        '  "mode": "approval",\n'
        '  "per_call_cap_atoms": 0,\n'
        '  "per_day_cap_atoms": 0,\n'
        '  "allowed_bots": null,\n'
        '  "approval_timeout_secs": 120,\n'
        '  "tip_wait_secs": 180\n'
        "}"
    )
    listed = Settings(allowed_bots=(BOT,), token="a<b>&c").to_json()
    assert f'"allowed_bots": [\n    "{BOT}"\n  ],' in listed
    assert '"token": "a\\u003cb\\u003e\\u0026c"' in listed


async def test_reload_settings_from_disk(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            path = env.data_dir / "mcpclient.json"
            assert env.bridge.listen_address is not None
            before = env.bridge.settings
            path.write_text("{broken")
            with pytest.raises(BridgeError, match="parse"):
                await env.bridge.reload_settings()
            assert env.bridge.settings == before
            path.write_text(json.dumps({**before.to_dict(), "enabled": False, "token": ""}))
            reloaded = await env.bridge.reload_settings()
            assert (reloaded.enabled, reloaded.token) == (False, "")
            assert env.bridge.listen_address is None
            assert json.loads(path.read_text())["token"] == ""  # nothing minted or rewritten
