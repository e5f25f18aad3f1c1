"""Prometheus metrics of both daemons: calls, payments, atoms, refunds,
tips, errors, latencies, sessions and reassembly bytes, served on loopback
only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from brmcp.clientrpc import BotConfig
from brmcp.metrics import BridgeMetrics, MetricsEndpoint, ServeMetrics
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing.fakebr import KIND_TIP_RECEIVED
from tests.kit.bridge import CLIENT, bridge_env, call, fixture_settings, until
from tests.kit.clientrpc import fake_network
from tests.server.test_run_bot import Recorder, cleared, make_harness, running_bot


def _value(metrics: Any, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else float(found)


async def test_bridge_counts_calls_payments_and_refusals(tmp_path: Path) -> None:
    metrics = BridgeMetrics()
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            env.bridge.use_metrics(metrics)
            async with env.session() as session:
                assert not (await call(session, "free")).is_error
                assert not (await call(session, "paid", {"text": "x", "count": 1})).is_error
                assert _value(metrics, "brmcp_bridge_sessions") == 1
                await env.bridge.apply_settings(env.bridge.settings.replace(per_call_cap_atoms=100))
                refused = await call(session, "paid", {"text": "x", "count": 1})
                assert refused.is_error
    assert _value(metrics, "brmcp_bridge_tool_calls_total", tool="free", outcome="ok") == 1
    assert _value(metrics, "brmcp_bridge_tool_calls_total", tool="paid", outcome="ok") == 1
    assert _value(metrics, "brmcp_bridge_tool_calls_total", tool="paid", outcome="tool_error") == 1
    assert _value(metrics, "brmcp_bridge_tool_call_seconds_count") == 3
    assert _value(metrics, "brmcp_bridge_payments_total", outcome="paid") == 1
    assert _value(metrics, "brmcp_bridge_payments_total", outcome="refused") == 1
    assert _value(metrics, "brmcp_bridge_paid_atoms_total") == 500
    assert _value(metrics, "brmcp_bridge_pending_approvals") == 0
    assert _value(metrics, "brmcp_bridge_reassembly_bytes") == 0
    assert _value(metrics, "brmcp_bridge_pms_sent_total") > 0


async def test_bridge_counts_waiting_approvals(tmp_path: Path) -> None:
    metrics = BridgeMetrics()
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env:
            env.bridge.use_metrics(metrics)
            async with env.session() as session, anyio.create_task_group() as tg:
                tg.start_soon(call, session, "paid", {"text": "x", "count": 1})
                await until(lambda: bool(env.bridge.pending_payments()))
                assert _value(metrics, "brmcp_bridge_pending_approvals") == 1
                (pending,) = env.bridge.pending_payments()
                env.bridge.resolve_payment(pending.id, False)
    assert _value(metrics, "brmcp_bridge_pending_approvals") == 0
    assert _value(metrics, "brmcp_bridge_payments_total", outcome="refused") == 1


async def test_serve_counts_calls_charges_refunds_and_tips(tmp_path: Path) -> None:
    metrics = ServeMetrics()
    harness = Harness(HarnessConfig(data_dir=tmp_path / "bot", allowed_peers={CLIENT}))
    harness.metrics = metrics

    @harness.tool(price_atoms=300)
    async def fortune(ctx: CallContext) -> dict[str, Any]:
        return {"ok": True}

    @harness.tool(price_atoms=200)
    async def broken(ctx: CallContext) -> dict[str, Any]:
        raise RuntimeError("boom")

    specs = {t.name: t for t in harness.tools()}
    async with harness:
        assert (await harness.call(CLIENT, specs["fortune"], {}, {}, None)).is_error  # payment required
        await harness.credit(CLIENT, 1000)
        assert not (await harness.call(CLIENT, specs["fortune"], {}, {}, None)).is_error
        assert (await harness.call(CLIENT, specs["broken"], {}, {}, None)).is_error
    assert _value(metrics, "brmcp_serve_tool_calls_total", tool="fortune", outcome="payment_required") == 1
    assert _value(metrics, "brmcp_serve_tool_calls_total", tool="fortune", outcome="ok") == 1
    assert _value(metrics, "brmcp_serve_tool_calls_total", tool="broken", outcome="error") == 1
    assert _value(metrics, "brmcp_serve_charged_atoms_total", tool="fortune") == 300
    assert _value(metrics, "brmcp_serve_charged_atoms_total", tool="broken") == 200
    assert _value(metrics, "brmcp_serve_refunds_total", tool="broken") == 1
    assert _value(metrics, "brmcp_serve_refunded_atoms_total", tool="broken") == 200
    assert _value(metrics, "brmcp_serve_tool_call_seconds_count", tool="fortune") == 2


async def test_serve_counts_tips(tmp_path: Path) -> None:
    metrics = ServeMetrics()
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice", "carol") as (_, (bot, alice, carol)):
            harness = make_harness(tmp_path / "h", alice.uid)
            harness.metrics = metrics
            async with running_bot(harness, bot, Recorder()) as (_, router):
                metrics.watch_router(lambda: router)
                tips = [
                    bot.emit_received_tip(alice.uid, 2_500_000),
                    bot.emit_received_tip(carol.uid, 9_000_000),
                ]
                await bot.wait_for(lambda: cleared(bot, KIND_TIP_RECEIVED, *(t.sequence_id for t in tips)))
                await until(lambda: _value(metrics, "brmcp_serve_tips_total", outcome="not_credited") == 1)
                assert _value(metrics, "brmcp_serve_sessions") == 0
    assert _value(metrics, "brmcp_serve_tips_total", outcome="credited") == 1
    assert _value(metrics, "brmcp_serve_tip_atoms_total") == 2500


async def test_endpoint_serves_on_loopback_only(tmp_path: Path) -> None:
    metrics = ServeMetrics()
    metrics.calls.labels("echo", "ok").inc()
    for bad in ("0.0.0.0:9464", "192.0.2.1:9464", "nonsense"):
        with pytest.raises(ValueError):
            MetricsEndpoint(metrics.registry, bad)
    endpoint = MetricsEndpoint(metrics.registry, "127.0.0.1:0")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            host, port = await endpoint.start(tg)
            assert host == "127.0.0.1"
            async with httpx2.AsyncClient(timeout=10) as http:
                page = await http.get(endpoint.url)
                assert page.status_code == 200
                assert 'brmcp_serve_tool_calls_total{outcome="ok",tool="echo"} 1.0' in page.text
                assert (await http.get(f"http://127.0.0.1:{port}/other")).status_code == 404
            await endpoint.stop()


def test_cli_refuses_a_non_loopback_metrics_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from brmcp.bridge.cli import main as bridge_main
    from brmcp.clientrpc import write_bot_config
    from brmcp.testing.fakebr.certs import ensure_brclient_certs

    root = tmp_path / "brclient"
    ensure_brclient_certs(root)
    datadir = tmp_path / "bridge"
    cfg = BotConfig.defaults(datadir, "brmcp-bridge")
    cfg.servercertpath, cfg.clientcertpath, cfg.clientkeypath = (
        str(root / "rpc.cert"),
        str(root / "rpc-client.cert"),
        str(root / "rpc-client.key"),
    )
    write_bot_config(datadir / "brmcp-bridge.conf", cfg)
    assert bridge_main(["--datadir", str(datadir), "--metrics", "0.0.0.0:9465"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("brmcp-bridge: --metrics: ")
    assert "loopback" in err


@pytest.mark.parametrize("kind", [ServeMetrics, BridgeMetrics])
def test_dropped_notifications_are_exported_with_the_pm_counts(
    kind: type[ServeMetrics | BridgeMetrics],
) -> None:
    """A notification whose PM could not be sent is dropped, its session kept
    (RouterStats.notifications_dropped): the operator sees how many, read
    from the router at scrape time."""
    from types import SimpleNamespace

    from brmcp.transport.router import RouterStats

    stats = RouterStats(send_failures=1, notifications_dropped=3)
    router = SimpleNamespace(session_count=2, assembler=SimpleNamespace(buffered_bytes=0), stats=stats)
    metrics = kind()
    metrics.watch_router(lambda: router)  # type: ignore[arg-type,return-value]
    prefix = "brmcp_serve" if kind is ServeMetrics else "brmcp_bridge"
    assert _value(metrics, f"{prefix}_notifications_dropped_total") == 3
    assert _value(metrics, f"{prefix}_send_failures_total") == 1
    stats.notifications_dropped += 1
    assert _value(metrics, f"{prefix}_notifications_dropped_total") == 4
