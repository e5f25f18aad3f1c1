"""Logs that tell the story at INFO: every payment the bridge
makes or refuses (bot, tool, atoms, outcome, spend id), every parked
approval with the command that decides it, every settings change from any
source, every charge, refund and tip at the bot with its reason; and no
secret in any of them."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import anyio
import pytest

from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing.fakebr import KIND_TIP_RECEIVED
from tests.kit.bridge import BOT, CLIENT, TOKEN, bridge_env, call, fixture_settings, until
from tests.kit.clientrpc import fake_network
from tests.server.test_run_bot import Recorder, cleared, make_harness, running_bot


def _messages(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def _no_secret(caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    for record in caplog.records:
        text = record.getMessage()
        for secret in secrets:
            assert secret not in text, text


async def test_autopay_payment_is_logged_with_its_spend_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            result = await call(session, "paid", {"text": "x", "count": 1})
            assert not result.is_error
            admin = env.bridge.admin_token
    lines = _messages(caplog)
    paying = [
        m
        for m in lines
        if re.fullmatch(rf"spend ([0-9a-f]{{8}}): paying 500 atoms to bot {BOT} for tool paid.*", m)
    ]
    assert len(paying) == 1, lines
    spend_id = paying[0].split()[1].rstrip(":")
    assert f"spend {spend_id}: paid 500 atoms to bot {BOT}" in lines
    charged = [m for m in lines if m.startswith(f"charged 500 atoms to {CLIENT} for paid (call ")]
    assert len(charged) == 1, lines
    # One id to follow a call through both logs: the callKey's first 8 hex digits.
    key = re.search(r"callKey ([0-9a-f]{8})", paying[0])
    assert key is not None, paying[0]
    assert f"callKey {key.group(1)}," in charged[0]
    # The first call went with its payment alongside: the bot held it until the tip
    # came, and says so, or the tip came first and the call was simply charged.
    # Either way no refusal line (it would read as if the call had failed).
    holding = [m for m in lines if m.startswith("holding call ")]
    assert all(f"of {CLIENT} to paid for 500 atoms" in m for m in holding), lines
    assert len(holding) <= 1, lines
    assert not any(m.startswith("payment required:") for m in lines), lines
    _no_secret(caplog, TOKEN, admin)


async def test_parked_approval_is_logged_with_the_command_and_its_outcome(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.session() as session:
            async with anyio.create_task_group() as tg:
                results: list[object] = []

                async def paid_call() -> None:
                    results.append(await call(session, "paid", {"text": "x", "count": 1}))

                tg.start_soon(paid_call)
                await until(lambda: bool(env.bridge.pending_payments()))
                (pending,) = env.bridge.pending_payments()
                parked = [
                    m for m in _messages(caplog) if m.startswith(f"payment {pending.id} waits for approval")
                ]
                assert len(parked) == 1
                assert f"500 atoms to bot {BOT} for tool paid" in parked[0]
                data_dir = env.data_dir
                assert f"brmcp-bridge --datadir {data_dir} approvals approve {pending.id}" in parked[0]
                assert f"brmcp-bridge --datadir {data_dir} approvals deny {pending.id}" in parked[0]
                assert env.bridge.resolve_payment(pending.id, False)
            admin = env.bridge.admin_token
    lines = _messages(caplog)
    assert f"payment {pending.id} denied" in lines
    assert f"payment to bot {BOT} for tool paid (500 atoms) not made: payment denied by the user" in lines, (
        lines
    )
    _no_secret(caplog, TOKEN, admin)


async def test_settings_changes_are_logged_from_every_source(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            bridge = env.bridge
            await bridge.apply_settings(bridge.settings.replace(per_call_cap_atoms=700))
            admin = {"Authorization": f"Bearer {bridge.admin_token}"}
            answer = await http.put("/admin/settings", json={"mode": "approval", "token": ""}, headers=admin)
            assert answer.status_code == 200
            new_token = answer.json()["token"]
            path = env.data_dir / "mcpclient.json"
            path.write_text(path.read_text().replace('"per_day_cap_atoms": 100000', '"per_day_cap_atoms": 5'))
            await bridge.reload_settings()
            admin_token = bridge.admin_token
    lines = _messages(caplog)
    assert "settings changed (apply_settings): per_call_cap_atoms 10000→700" in lines, lines
    assert 'settings changed (admin API): token changed, mode "autopay"→"approval"' in lines, lines
    assert f"settings changed (reload of {path}): per_day_cap_atoms 100000→5" in lines, lines
    _no_secret(caplog, TOKEN, new_token, admin_token)


async def test_refund_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    harness = Harness(HarnessConfig(data_dir=tmp_path / "bot", allowed_peers={CLIENT}))

    @harness.tool(price_atoms=300)
    async def broken(ctx: CallContext) -> dict[str, object]:
        raise RuntimeError("the printer is on fire")

    async with harness:
        await harness.credit(CLIENT, 1000)
        spec = next(t for t in harness.tools() if t.name == "broken")
        result = await harness.call(CLIENT, spec, {}, {}, None)
        assert result.is_error
        assert await harness.balance(CLIENT) == 1000
    lines = _messages(caplog)
    assert any(m.startswith(f"charged 300 atoms to {CLIENT} for broken (call ") for m in lines), lines
    refunds = [m for m in lines if m.startswith(f"refunded 300 atoms to {CLIENT} (call ")]
    assert len(refunds) == 1
    # The refund line names the ref of the logged traceback; the peer never sees the exception's text.
    assert re.search(r"the call failed: internal error in tool broken; .*\(ref [0-9a-f]{8}\)$", refunds[0])
    assert any("the printer is on fire" in m for m in lines), lines


async def test_tips_credited_or_refused_are_logged_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice", "carol") as (_, (bot, alice, carol)):
            harness = make_harness(tmp_path / "h", alice.uid)
            async with running_bot(harness, bot, Recorder()):
                tips = [
                    bot.emit_received_tip(alice.uid, 2_500_000),
                    bot.emit_received_tip(carol.uid, 9_000_000),
                    bot.emit_received_tip(alice.uid, 999),
                ]
                seqs = [t.sequence_id for t in tips]
                await bot.wait_for(lambda: cleared(bot, KIND_TIP_RECEIVED, *seqs))
                await until(lambda: sum(m.startswith("tip ") for m in _messages(caplog)) >= 3)
    lines = _messages(caplog)
    assert f"tip {seqs[0]}: credited 2500 atoms to {alice.uid} (2500000 matoms received)" in lines, lines
    refused = f"tip {seqs[1]}: 9000000 matoms from {carol.uid} not credited: the sender is not an allowed"
    assert any(m.startswith(refused) for m in lines), lines
    assert f"tip {seqs[2]}: 999 matoms from {alice.uid} not credited: under 1 atom (1,000 matoms)" in lines
