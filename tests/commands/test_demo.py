"""`brmcp demo` end to end: the transcript's facts (one execution, one charge,
books that add up), the plain-text progress, failure reporting and the
console entry points."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from brmcp.cli import main
from brmcp.demo import DEMO_PER_CALL_CAP, ECHO_TEXT, NO_GO, DemoError, DemoOptions, run_demo


async def test_demo_transcript_facts(tmp_path: Path) -> None:
    out = io.StringIO()
    report = await run_demo(DemoOptions(datadir=tmp_path / "demo", step_timeout=60), out, tty=False)
    text = out.getvalue()

    # The agent saw both tools with their advertised prices.
    assert report.tools == {"echo": "free", "fortune": "10000 atoms"}
    assert json.loads(report.echo_text) == {"echo": ECHO_TEXT}
    assert "fortune" in json.loads(report.fortune)
    # One execution, one charge, one paid spend entry; the books add up.
    assert report.fortune_executions == 1
    assert report.charges == [10_000]
    assert report.tips_credited == [10_000]
    assert report.bot_balance == 0
    assert [(e["tool"], e["atoms"], e["status"]) for e in report.spend_entries] == [
        ("fortune", 10_000, "paid")
    ]
    assert report.spend_total == 10_000 <= DEMO_PER_CALL_CAP
    # Relay PM costs: tools/list is served locally, a free call is one round
    # trip, the first paid call is paid alongside: the marked call waits at
    # the bot for the tip, then its result (more only when the hold ran out
    # and the bridge reissued).
    assert report.pms["list"] == 0
    assert report.pms["echo"] == 2
    assert report.pms["fortune"] >= 2
    assert report.pms["fortune"] % 2 == 0
    # The transcript shows every step, the PMs, the ledger and the spend log.
    for n in range(1, 9):
        assert f"[{n}/8]" in text
    if report.pms["fortune"] > 2:
        assert "payment_required: price 10000, balance 0, shortfall 10000 atoms" in text
    assert "tip of 10000 atoms" in text
    charge_lines = [line for line in text.splitlines() if "bot ledger, alice: charge" in line]
    assert len(charge_lines) == 1
    key = charge_lines[0].rsplit("callKey ", 1)[1]
    # The reissue used the same callKey as the first attempt.
    assert text.count(f"tools/call fortune {{}} callKey {key}") == report.pms["fortune"] // 2
    assert "bridge spend log: fortune 10000 atoms by tip to bot, paid" in text
    assert "Demo finished" in text
    assert "\r" not in text  # no spinner when the output is not a terminal
    assert report.endpoint.endswith(f"/mcp/{report.bot_uid}")


async def test_demo_with_relay_latency(tmp_path: Path) -> None:
    out = io.StringIO()
    report = await run_demo(DemoOptions(datadir=tmp_path / "demo", latency_ms=40), out, tty=False)
    assert report.fortune_executions == 1
    assert report.charges == [10_000]
    assert "with 40 ms latency" in out.getvalue()


async def test_demo_reports_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(DemoError, match=f"cannot listen on 127.0.0.1:{port}: address already in use"):
            await run_demo(DemoOptions(datadir=tmp_path / "demo", port=port), io.StringIO(), tty=False)


async def test_demo_step_timeout_names_the_step(tmp_path: Path) -> None:
    # A relay so slow that the agent's first round trip cannot finish in time.
    out = io.StringIO()
    with pytest.raises(DemoError, match=r"step 'Agent connects .*' timed out"):
        await run_demo(
            DemoOptions(datadir=tmp_path / "demo", latency_ms=3000, step_timeout=0.5), out, tty=False
        )
    assert "FAILED" in out.getvalue()


async def test_demo_cleans_up_its_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    await run_demo(DemoOptions(), io.StringIO(), tty=False)
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith("brmcp-demo-")]
    assert not leftovers


async def test_demo_refuses_a_used_directory(tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "mcpspend.json").write_text("[]")
    with pytest.raises(DemoError, match="is not empty; pass a new or empty directory"):
        await run_demo(DemoOptions(datadir=used), io.StringIO(), tty=False)
    assert (used / "mcpspend.json").read_text() == "[]"


def test_cli_version_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip()
    assert main([]) == 2
    with pytest.raises(SystemExit):
        main(["demo", "--latency", "-1"])
    assert "brmcp demo: error: --latency must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("brmcp ")


def test_python_m_brmcp_demo_exits_zero(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "brmcp", "demo", "--datadir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Demo finished" in result.stdout
    assert "fortune ran 1 time(s); 1 charge(s) on the ledger" in result.stdout


@pytest.mark.slow  # over 10 s of subprocess start-ups
def test_demo_real_network_without_go_is_one_clear_line(tmp_path: Path) -> None:
    env = {**os.environ, "BRMCP_GO": str(tmp_path / "no-go"), "BRMCP_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "brmcp", "demo", "--network", "real"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors == [f"brmcp demo: {NO_GO}"]
