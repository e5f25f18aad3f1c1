"""The local admin surface the daemon's CLI talks to (brmcp/bridge/admin/_routes.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio

from brmcp.bridge import ADMIN_TOKEN_FILE
from brmcp.bridge.pay import arguments_hash
from tests.kit.bridge import BOT, START, TOKEN, bridge_env, call, fixture_settings, until


def _admin(env: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {env.bridge.admin_token}"}


async def test_settings_show_and_set(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            shown = await http.get("/admin/settings", headers=_admin(env))
            assert shown.status_code == 200
            assert shown.json() == env.bridge.settings.to_dict()
            assert list(shown.json()) == [
                "enabled",
                "token",
                "mode",
                "per_call_cap_atoms",
                "per_day_cap_atoms",
                "allowed_bots",
                "approval_timeout_secs",
                "tip_wait_secs",
            ]
            changed = await http.put(
                "/admin/settings", json={"per_day_cap_atoms": 5_000}, headers=_admin(env)
            )
            assert changed.status_code == 200
            assert changed.json()["per_day_cap_atoms"] == 5_000
            on_disk = json.loads((env.data_dir / "mcpclient.json").read_text())
            assert on_disk["per_day_cap_atoms"] == 5_000
            for body, fragment in (
                ({"per_day_cap": 1}, "unknown setting 'per_day_cap' (did you mean per_day_cap_atoms?)"),
                ({"allowed_bots": ["zz"]}, 'allowed bot "zz" is not a 64-hex uid'),
                ({"per_call_cap_atoms": "lots"}, "per_call_cap_atoms"),
                ([1, 2], "JSON object"),
                ({"token": "abc"}, "token is 3 character(s): use at least 16"),
                ({"token": "with space 0123456789"}, "token must not contain spaces"),
            ):
                refused = await http.put("/admin/settings", json=body, headers=_admin(env))
                assert refused.status_code == 400, body
                assert fragment in refused.json()["error"]
            bad = await http.put("/admin/settings", content=b"{nope", headers=_admin(env))
            assert bad.status_code == 400
            assert env.bridge.settings.per_day_cap_atoms == 5_000
            assert (await http.delete("/admin/settings", headers=_admin(env))).status_code == 405
            assert (await http.get("/admin/nothing", headers=_admin(env))).status_code == 404


async def test_token_rotation_through_admin(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            async with env.http() as http:
                rotated = await http.post("/admin/settings", json={"token": ""}, headers=_admin(env))
                assert rotated.status_code == 200
                new_token = rotated.json()["token"]
                assert len(new_token) == 32
                assert new_token != TOKEN
            # The listener restarts after the response; the new token works.

            async def restarted() -> bool:
                if env.bridge.listen_address is None:
                    return False
                try:
                    async with env.http() as http:
                        probe = await http.get("/admin/settings", headers=_admin(env))
                except OSError:
                    return False
                return probe.status_code == 200 and probe.json()["token"] == new_token

            await until(restarted, 10)
            async with env.session(token=new_token) as session:
                assert not (await call(session, "free")).is_error
            async with env.http() as http:
                off = await http.put("/admin/settings", json={"enabled": False}, headers=_admin(env))
                assert off.status_code == 200
                assert off.json()["enabled"] is False
            await until(lambda: env.bridge.listen_address is None)


async def test_approvals_and_spend(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with (
            bridge_env(tmp_path, settings=fixture_settings(mode="approval"), auto_clock=False) as env,
            env.session() as session,
            env.http() as http,
        ):
            results = []

            async def one() -> None:
                results.append(await call(session, "paid", {"text": "x"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one)
                listed: list[dict[str, Any]] = []

                async def parked() -> bool:
                    listed[:] = (await http.get("/admin/approvals", headers=_admin(env))).json()["pending"]
                    return bool(listed)

                await until(parked)
                (pending,) = listed
                assert pending == {
                    "id": pending["id"],
                    "bot": BOT,
                    "tool": "paid",
                    "atoms": 500,
                    "created": START,
                }
                assert (
                    await http.get(f"/admin/approvals/{pending['id']}/approve", headers=_admin(env))
                ).status_code == 405
                unknown = await http.post("/admin/approvals/0000000000000000/approve", headers=_admin(env))
                assert unknown.status_code == 404
                approved = await http.post(f"/admin/approvals/{pending['id']}/approve", headers=_admin(env))
                assert approved.json() == {"id": pending["id"], "approved": True}
            assert results[0].structured_content == {"n": 1}
            spend = (await http.get("/admin/spend", headers=_admin(env))).json()
            # The entry names the logical call's callKey (32 hex; the Go reference ignores the key).
            key = spend["entries"][0].pop("callKey")
            assert re.fullmatch(r"[0-9a-f]{32}", key)
            # ... and the hash of its arguments, so a retry after a crash adopts the payment.
            assert spend["entries"][0].pop("argsHash") == arguments_hash({"text": "x"})
            # ... and that its call was answered (never taken over again).
            assert spend["entries"][0].pop("answered") is True
            assert spend == {
                "entries": [
                    {"ts": START, "bot": BOT, "tool": "paid", "rail": "tip", "atoms": 500, "status": "paid"}
                ],
                "day_total_atoms": 500,
            }


async def test_config_snippet(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            response = await http.get(f"/admin/config-snippet/{BOT.upper()}", headers=_admin(env))
            assert response.status_code == 200
            snippet = response.json()
            url = f"{env.base_url}/mcp/{BOT}"
            assert snippet["name"] == "brmcp-11111111"
            assert snippet["url"] == url
            assert snippet["allowed"] is True
            assert snippet["mcp_json"] == {
                "mcpServers": {
                    "brmcp-11111111": {
                        "type": "http",
                        "url": url,
                        "headers": {"Authorization": f"Bearer {TOKEN}"},
                    }
                }
            }
            assert snippet["claude_command"] == (
                f"claude mcp add --transport http brmcp-11111111 {url} "
                f'--header "Authorization: Bearer {TOKEN}"'
            )
            assert env.bridge.config_snippet(BOT).to_dict() == {
                k: v for k, v in snippet.items() if k != "allowed"
            }
            bad = await http.get("/admin/config-snippet/xyz", headers=_admin(env))
            assert bad.status_code == 400


async def test_admin_token_file(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            token = env.bridge.admin_token
            path = env.data_dir / ADMIN_TOKEN_FILE
            assert path.read_text() == token + "\n"
            assert path.stat().st_mode & 0o777 == 0o600
            assert len(token) == 32
            assert token != env.bridge.settings.token
        async with bridge_env(tmp_path) as again:
            assert again.bridge.admin_token == token
