"""``brmcp demo --network real``: the demo's transcript over a real relay and
real clients (brnet), with the same facts as on the fake network."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from brmcp.demo import ECHO_TEXT, DemoOptions, run_demo

pytestmark = pytest.mark.realnet


async def test_demo_on_the_real_network(brnet_exe: Path, tmp_path: Path) -> None:
    out = io.StringIO()
    report = await run_demo(
        DemoOptions(datadir=tmp_path / "demo", step_timeout=90, network="real"), out, tty=False
    )
    text = out.getvalue()
    assert report.tools == {"echo": "free", "fortune": "10000 atoms"}
    assert json.loads(report.echo_text) == {"echo": ECHO_TEXT}
    assert report.fortune_executions == 1
    assert report.charges == [10_000]
    assert report.tips_credited == [10_000]
    assert report.bot_balance == 0
    assert [(e["tool"], e["atoms"], e["status"]) for e in report.spend_entries] == [
        ("fortune", 10_000, "paid")
    ]
    # PMs counted on the real clients' PM streams: one round trip for echo,
    # call + payment_required + reissue + result for the paid call.
    assert report.pms["list"] == 0
    assert report.pms["echo"] == 2
    assert report.pms["fortune"] >= 4
    assert "Start a real Bison Relay network (brnet)" in text
    assert "(bisonrelay server)" in text
    assert "payment_required: price 10000, balance 0, shortfall 10000 atoms" in text
    for n in range(1, 9):
        assert f"[{n}/8]" in text
    assert "Demo finished" in text
