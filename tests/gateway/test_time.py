"""The gateway in front of ``mcp-server-time`` (PyPI, stdio; nobody here
wrote it), through agent → bridge → fabric → gateway → upstream."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from brmcp.gateway import CALLER_UID_KEY, Gateway, GatewayError, PriceTable, UpstreamConfig
from brmcp.protocol.payment import PRICE_ATOMS_KEY
from brmcp.server import Harness, HarnessConfig
from tests.kit.gateway import CLIENT, call, gateway_stack, joined, pid_wrapped, time_server_command, until

PRICES = PriceTable.parse(json.dumps({"default": 2500, "tools": {"get_current_time": "free"}}))


def _time_upstream(**changes: Any) -> UpstreamConfig:
    return UpstreamConfig(command=tuple(time_server_command()), **changes)


async def test_tools_are_mirrored_with_prices(tmp_path: Path) -> None:
    async with gateway_stack(tmp_path, _time_upstream(), PRICES) as env, env.session() as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        upstream_session, _ = await env.gateway.upstream.ready()
        originals = {tool.name: tool for tool in (await upstream_session.list_tools()).tools}
    assert set(listed) == {"get_current_time", "convert_time"}
    for name, tool in listed.items():
        original = originals[name]
        assert tool.description == original.description
        assert tool.input_schema == original.input_schema
        assert tool.output_schema == original.output_schema
        assert tool.annotations == original.annotations
    assert listed["get_current_time"].meta == {PRICE_ATOMS_KEY: 0}
    assert listed["convert_time"].meta == {PRICE_ATOMS_KEY: 2500}


async def test_free_call_reaches_the_upstream_and_charges_nothing(tmp_path: Path) -> None:
    async with gateway_stack(tmp_path, _time_upstream(), PRICES) as env, env.session() as session:
        result = await call(session, "get_current_time", {"timezone": "Europe/Paris"})
        assert not result.is_error, result
        assert result.structured_content is not None
        assert result.structured_content["timezone"] == "Europe/Paris"
        assert env.gateway.upstream_calls == 1
        assert env.payer.payments == []
        assert await env.statement_kinds() == []


async def test_paid_call_pays_once_and_runs_the_upstream_once(tmp_path: Path) -> None:
    args = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    async with gateway_stack(tmp_path, _time_upstream(), PRICES) as env, env.session() as session:
        result = await call(session, "convert_time", args)
        assert not result.is_error, joined(result)
        assert result.structured_content is not None
        assert result.structured_content["target"]["datetime"].startswith(
            result.structured_content["target"]["datetime"][:10]
        )
        assert "+9.0h" in result.structured_content["time_difference"]
        # payment_required → one tip → the retry with the same callKey ran the upstream once.
        assert env.payer.payments == [2500]
        assert env.gateway.upstream_calls == 1
        assert await env.statement_kinds() == [("credit", 2500), ("charge", -2500)]
        assert await env.harness.balance(CLIENT) == 0
        spend = env.bridge.spend_log().entries
        assert [(e.tool, e.atoms, e.status) for e in spend] == [("convert_time", 2500, "paid")]


async def test_upstream_error_is_refunded(tmp_path: Path) -> None:
    bad = {"source_timezone": "Nowhere/Bad", "time": "12:00", "target_timezone": "UTC"}
    async with gateway_stack(tmp_path, _time_upstream(), PRICES) as env, env.session() as session:
        result = await call(session, "convert_time", bad)
        assert result.is_error
        assert "Nowhere/Bad" in joined(result)
        assert env.gateway.upstream_calls == 1
        assert env.payer.payments == [2500]
        # Charged, then refunded in the same transaction as the failure: the
        # tip stays as prepaid balance, nothing was lost or charged twice.
        assert await env.statement_kinds() == [("credit", 2500), ("charge", -2500), ("refund", 2500)]
        assert await env.harness.balance(CLIENT) == 2500


async def test_invalid_arguments_never_reach_the_upstream(tmp_path: Path) -> None:
    async with gateway_stack(tmp_path, _time_upstream(), PRICES) as env, env.session() as session:
        result = await call(session, "convert_time", {"time": "12:00"})
        assert result.is_error
        assert 'validating "arguments"' in joined(result)
        assert env.gateway.upstream_calls == 0
        assert env.payer.payments == []


async def test_hidden_tools_and_price_reload(tmp_path: Path) -> None:
    hidden = PriceTable.parse('{"default": "hidden", "tools": {"get_current_time": 40}}')
    args = {"source_timezone": "UTC", "time": "01:00", "target_timezone": "UTC"}
    async with gateway_stack(tmp_path, _time_upstream(), hidden) as env, env.session() as session:
        listed = (await session.list_tools()).tools
        assert [(t.name, t.meta) for t in listed] == [("get_current_time", {PRICE_ATOMS_KEY: 40})]
        with pytest.raises(MCPError, match='unknown tool "convert_time"'):
            await call(session, "convert_time", args)
        assert env.gateway.upstream_calls == 0
        # Reload: every tool free. The bot tells the bridge (tools/list_changed),
        # which fetches the new list at once (then relays the notification).
        assert env.gateway.set_prices(PriceTable.parse('{"default": "free"}'))
        await until(lambda: env.bridge_link_lists("convert_time"))
        listed = (await session.list_tools()).tools
        assert sorted((t.name, t.meta[PRICE_ATOMS_KEY]) for t in listed if t.meta) == [
            ("convert_time", 0),
            ("get_current_time", 0),
        ]
        result = await call(session, "convert_time", args)
        assert not result.is_error, joined(result)
        assert env.payer.payments == []
        # The same table again changes nothing and notifies nobody.
        assert not env.gateway.set_prices(PriceTable.parse('{"default": "free"}'))


async def test_caller_uid_only_when_configured(tmp_path: Path) -> None:
    seen: list[Any] = []
    async with gateway_stack(tmp_path, _time_upstream(), PRICES) as env, env.session() as session:
        original = env.gateway.upstream.request

        async def spy(request: Any, result_type: Any, **kwargs: Any) -> Any:
            seen.append(request.params.meta)
            return await original(request, result_type, **kwargs)

        env.gateway.upstream.request = spy  # type: ignore[method-assign]
        await call(session, "get_current_time", {"timezone": "UTC"})
    async with (
        gateway_stack(tmp_path / "b", _time_upstream(send_caller_uid=True), PRICES) as env,
        env.session() as session,
    ):
        original = env.gateway.upstream.request
        env.gateway.upstream.request = spy  # type: ignore[method-assign]
        await call(session, "get_current_time", {"timezone": "UTC"})
    assert seen == [None, {CALLER_UID_KEY: CLIENT}]


async def test_upstream_killed_while_idle_is_restarted(tmp_path: Path) -> None:
    pidfile = tmp_path / "upstream.pid"
    upstream = UpstreamConfig(command=tuple(pid_wrapped(time_server_command(), pidfile)))
    async with gateway_stack(tmp_path, upstream, PRICES) as env, env.session() as session:
        first = int(pidfile.read_text())
        os.kill(first, signal.SIGKILL)
        await until(lambda: env.gateway.upstream.generation == 2 and env.gateway.upstream.session is not None)
        assert int(pidfile.read_text()) != first
        result = await call(session, "get_current_time", {"timezone": "UTC"})
        assert not result.is_error, joined(result)
        assert env.gateway.upstream.exits == 1


async def test_first_start_failure_is_a_clear_error(tmp_path: Path) -> None:
    upstream = UpstreamConfig(command=(str(tmp_path / "no-such-server"),))
    harness = Harness(HarnessConfig(data_dir=tmp_path, tools_list_changed=True))
    gateway = Gateway(harness, upstream, PRICES)
    with pytest.raises(
        GatewayError, match=r"cannot start the upstream MCP server \(stdio: .*no-such-server\)"
    ):
        await gateway.run()
    assert harness.tools() == []


def test_gateway_needs_a_harness_that_declares_tool_changes(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path))
    with pytest.raises(ValueError, match="tools_list_changed=True"):
        Gateway(harness, _time_upstream(), PRICES)
