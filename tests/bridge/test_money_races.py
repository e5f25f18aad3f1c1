"""The bridge's money paths under hostile timing and input: settings that
change while a payment waits for the spend log (a lowered cap, approval
mode, a de-listed bot, the kill switch), content nested past the recursion
limit (from a bot, in a state file, in an MCP request body), and hostile
text in the approvals and spend tables the CLI prints. Each test's docstring
gives the scenario; they run without a network against the settler, the
spend log, the HTTP gate and the CLI's tables.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp.types import CallToolResult, TextContent

from brmcp import PaymentRequired, parse_payment_required
from brmcp.bridge import BridgeError, ManualClock
from brmcp.bridge.base import Settings, load_settings
from brmcp.bridge.pay import Settler, SpendLog
from tests.kit.bridge import BOT as FIXTURE_BOT
from tests.kit.bridge import auth, bridge_env, until

BOT = "b" * 64


class _Payer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.calls.append((payee_uid, atoms))


def _autopay(**changes: object) -> Settings:
    base = Settings(
        enabled=True,
        token="t" * 32,
        mode="autopay",
        per_call_cap_atoms=1_000,
        per_day_cap_atoms=10_000,
        allowed_bots=(BOT,),
    )
    return base.replace(**changes)


def _refusal(atoms: int) -> PaymentRequired:
    return PaymentRequired(tool="paid", price_atoms=atoms, balance_atoms=0, shortfall_atoms=atoms)


async def _settle_while_settings_change(tmp_path: Path, new: Settings) -> tuple[str | None, _Payer, Settler]:
    """Start a settlement while the spend lock is held (another payment is
    writing the spend log), change the settings, then let it run."""
    current = [_autopay()]
    payer = _Payer()
    settler = Settler(
        spend=SpendLog(tmp_path / "mcpspend.json"),
        payer=payer,
        clock=ManualClock(1_800_000_000.0, auto=True),
        settings=lambda: current[0],
    )
    outcome: list[str | None] = []

    async def settle() -> None:
        outcome.append(await settler.settle(BOT, "paid", _refusal(500)))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg, settler._lock:
            tg.start_soon(settle)
            await until(lambda: settler._lock.statistics().tasks_waiting == 1)
            current[0] = new
    return outcome[0], payer, settler


async def test_settle_honours_a_per_call_cap_lowered_while_it_waits(tmp_path: Path) -> None:
    """The user drops the per-call cap to 0 ("never pay") while a payment
    queues behind another payment's spend-log write: the queued payment must
    be refused under the new cap, not paid under the stale one."""
    reason, payer, settler = await _settle_while_settings_change(tmp_path, _autopay(per_call_cap_atoms=0))
    assert payer.calls == []
    assert reason == "500 atoms exceeds the per-call cap (0)"
    assert settler.summary().entries == ()


async def test_settle_honours_a_switch_to_approval_while_it_waits(tmp_path: Path) -> None:
    """Autopay switched to approval while a payment queues: it must be parked
    for the user's decision (here: times out), never paid unasked."""
    current_mode = _autopay(mode="approval", approval_timeout_secs=5)
    reason, payer, _ = await _settle_while_settings_change(tmp_path, current_mode)
    assert payer.calls == []
    assert reason == "approval timed out after 5s"


async def test_settle_refuses_a_bot_delisted_while_it_waits(tmp_path: Path) -> None:
    """A bot removed from allowed_bots must not be paid by a call that was
    already past the first cap check."""
    reason, payer, _ = await _settle_while_settings_change(tmp_path, _autopay(allowed_bots=()))
    assert payer.calls == []
    assert reason == "bot is not allowed"


async def test_settle_refuses_after_the_bridge_is_disabled(tmp_path: Path) -> None:
    """Disabling the bridge is the kill switch: a payment still in flight
    must not go out afterwards."""
    reason, payer, _ = await _settle_while_settings_change(tmp_path, _autopay(enabled=False))
    assert payer.calls == []
    assert reason == "the bridge is disabled"


# -- deeply nested JSON (RecursionError escaped every JSON reader) ------------------

DEEP = "[" * 100_000


def test_payment_parser_survives_deeply_nested_text() -> None:
    """A hostile bot's text content nested past the recursion limit made
    parse_payment_required raise RecursionError (it promises never to raise
    for bad content); the bridge then answered the agent with the
    interpreter's internal error instead of the bot's result."""
    result = CallToolResult(content=[TextContent(type="text", text=DEEP)], is_error=True)
    assert parse_payment_required(result) is None


@pytest.mark.parametrize("name", ["mcpclient.json", "mcpspend.json"])
def test_deeply_nested_state_file_is_a_clear_error(tmp_path: Path, name: str) -> None:
    """A corrupt state file must stop start-up with ``parse <path>: …``, not a
    RecursionError traceback."""
    (tmp_path / name).write_text(DEEP)
    loader = load_settings if name == "mcpclient.json" else SpendLog.load
    with pytest.raises(BridgeError, match="parse"):
        loader(tmp_path / name)


async def test_deeply_nested_http_body_is_a_parse_error(tmp_path: Path) -> None:
    """The MCP endpoint answers a body nested past the recursion limit with
    400/-32700 like any unparsable body (it was a 500 with a logged traceback)."""
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            response = await http.post(f"/mcp/{FIXTURE_BOT}", content=DEEP.encode(), headers=auth())
            assert response.status_code == 400
            assert response.json()["error"]["code"] == -32700
            admin = await http.put(
                "/admin/settings",
                content=DEEP[:30_000].encode(),  # under the admin body limit, past the recursion limit
                headers={"Authorization": f"Bearer {env.bridge.admin_token}"},
            )
            assert admin.status_code == 400


# -- terminal output of the CLI -------------------------------------------------------


def test_cli_tables_neutralise_control_characters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tool names come from the bot and error texts from brclient; printed
    raw, an escape sequence or carriage return in them could rewrite the
    approvals table the user decides from (e.g. show a smaller amount)."""
    import argparse

    from brmcp.bridge.cli import _adminclient
    from brmcp.bridge.cli import _main as cli

    hostile = "fortune\r\x1b[2K" + "x" * 3 + "\x1b]0;pwned\x07"
    answers = {
        "/admin/approvals": {
            "pending": [{"id": "00" * 8, "bot": BOT, "tool": hostile, "atoms": 9_000, "created": 1}]
        },
        "/admin/bot-requests": {
            "pending": [
                {
                    "id": "11" * 8,
                    "uid": BOT,
                    "reason": hostile,
                    "via": None,
                    "agent": hostile,
                    "requestedAt": 1,
                    "expiresAt": 2,
                    "contact": True,
                }
            ],
            "recent": [],
        },
        "/admin/spend": {
            "entries": [
                {
                    "ts": 1,
                    "bot": BOT,
                    "tool": hostile,
                    "rail": "tip",
                    "atoms": 9,
                    "status": "failed",
                    "err": hostile,
                }
            ],
            "day_total_atoms": 0,
        },
    }
    monkeypatch.setattr(cli, "admin", lambda daemon, method, path, body=None: answers[path])
    daemon = _adminclient.Daemon(Path("."), 1, "http://127.0.0.1:1", False, "t")
    monkeypatch.setattr(cli, "locate", lambda datadir: daemon)
    cli._cmd_approvals(daemon.datadir, argparse.Namespace(action="list", id=None, json=False))
    cli._cmd_spend(daemon.datadir, argparse.Namespace(json=False))
    out = capsys.readouterr().out
    for control in ("\x1b", "\r", "\x07"):
        assert control not in out
    assert "9,000" in out
