"""The README's "Try the real-bot flow with fakebr" section, as a new user
runs it: separate processes for brmcp-fakebr (with --write-confs), brmcp-serve
and brmcp-bridge, no config edited by hand; an SDK agent lists the tools,
calls the free one, and calls the paid one, which waits for approval until
``brmcp-bridge approvals approve`` and is then paid once and answered."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.kit import until

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@asynccontextmanager
async def _process(*args: str, log: Path) -> AsyncIterator[anyio.abc.Process]:
    """``python -m ARGS`` with stdout piped and stderr (its log) in ``log``."""
    with log.open("wb") as err:
        proc = await anyio.open_process([sys.executable, "-m", *args], env=ENV, stderr=err)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with anyio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await proc.aclose()


async def _cli(*args: str) -> tuple[int, str, str]:
    done = await anyio.run_process([sys.executable, "-m", "brmcp.bridge", *args], env=ENV, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def _read_until(proc: anyio.abc.Process, marker: bytes) -> str:
    assert proc.stdout is not None
    seen = b""
    while marker not in seen:
        seen += await proc.stdout.receive()
    return seen.decode()


@pytest.mark.slow  # over 10 s of subprocess start-ups
async def test_readme_flow_with_fakebr_needs_no_hand_edited_config(tmp_path: Path) -> None:
    fake_dir, confs = tmp_path / "fakebr", tmp_path / "confs"
    with anyio.fail_after(120):
        fakebr_args = ["--datadir", str(fake_dir), "--users", "bot,alice", "--write-confs", str(confs)]
        async with _process("brmcp.testing.fakebr", *fakebr_args, log=tmp_path / "fakebr.log") as fakebr:
            out = await _read_until(fakebr, b"Ctrl-C to stop")
            summary = json.loads((fake_dir / "fakebr.json").read_text())
            bot_uid = next(u["uid"] for u in summary["users"] if u["nick"] == "bot")
            alice_uid = next(u["uid"] for u in summary["users"] if u["nick"] == "alice")
            serve_dir, bridge_dir = confs / "brmcp-serve", confs / "brmcp-bridge-alice"
            assert f"brmcp-serve --datadir {serve_dir}" in out
            assert f"brmcp-bridge --datadir {bridge_dir} config-snippet {bot_uid}" in out
            assert json.loads((serve_dir / "brmcp.json").read_text())["allowed_uids"] == [alice_uid]
            async with (
                _process(
                    "brmcp.serve",
                    *("--datadir", str(serve_dir), "--metrics", "127.0.0.1:0"),
                    log=tmp_path / "serve.log",
                ) as serve,
                _process(
                    "brmcp.bridge",
                    "--datadir",
                    str(bridge_dir),
                    "--listen",
                    "127.0.0.1:0",
                    "--metrics",
                    "127.0.0.1:0",
                    log=tmp_path / "bridge.log",
                ) as bridge,
            ):
                await until(lambda: _started(bridge, bridge_dir / "brmcp-bridge.runtime.json"))
                code, snippet_out, err = await _cli(
                    "--datadir", str(bridge_dir), "--json", "config-snippet", bot_uid
                )
                assert code == 0, err
                snippet = json.loads(snippet_out)
                assert snippet["allowed"] is True
                server = snippet["mcp_json"]["mcpServers"][snippet["name"]]
                await _agent(server["url"], server["headers"], bridge_dir)
                assert serve.returncode is None
                # Both daemons' Prometheus endpoints (--metrics) count the paid call.
                async with httpx2.AsyncClient(timeout=10) as http:
                    bot_metrics = (await http.get(_metrics_url(tmp_path / "serve.log"))).text
                    bridge_metrics = (await http.get(_metrics_url(tmp_path / "bridge.log"))).text
                assert 'brmcp_serve_charged_atoms_total{tool="fortune"} 10000.0' in bot_metrics
                assert 'brmcp_serve_tool_calls_total{outcome="ok",tool="echo"} 1.0' in bot_metrics
                assert "brmcp_bridge_paid_atoms_total 10000.0" in bridge_metrics
                assert 'brmcp_bridge_payments_total{outcome="paid"} 1.0' in bridge_metrics
            code, spend_out, err = await _cli("--datadir", str(bridge_dir), "--json", "spend")
            assert code == 0, err
            spend = json.loads(spend_out)
            assert [(e["bot"], e["tool"], e["atoms"], e["status"]) for e in spend["entries"]] == [
                (bot_uid, "fortune", 10_000, "paid")
            ]


def _started(process: anyio.abc.Process, runtime: Path) -> bool:
    """True once the daemon wrote its runtime file; fails if it exited first."""
    assert process.returncode is None
    return runtime.exists()


def _metrics_url(log: Path) -> str:
    found = re.search(r"metrics at (http://\S+/metrics)", log.read_text())
    assert found is not None, log.read_text()
    return found.group(1)


async def _agent(url: str, headers: dict[str, str], bridge_dir: Path) -> None:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) >= {"echo", "fortune"}
        echoed = await session.call_tool("echo", {"text": "hi"})
        assert not echoed.is_error
        results: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def paid() -> None:
                results.append(await session.call_tool("fortune", {}))

            tg.start_soon(paid)
            pending: list[dict[str, Any]] = []

            async def parked() -> bool:
                code, out, err = await _cli("--datadir", str(bridge_dir), "--json", "approvals")
                assert code == 0, err
                pending[:] = json.loads(out)["pending"]
                return bool(pending)

            await until(parked, limit=60)
            assert (pending[0]["tool"], pending[0]["atoms"]) == ("fortune", 10_000)
            code, out, err = await _cli(
                "--datadir", str(bridge_dir), "approvals", "approve", pending[0]["id"]
            )
            assert (code, out.strip()) == (0, f"approved {pending[0]['id']}"), err
        (result,) = results
        assert not result.is_error, result
