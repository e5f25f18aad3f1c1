"""The Go reference reads the spend log this bridge writes (BRIDGE.md
§Spend log and approvals): our entries carry ``callKey`` and ``prepay``,
keys the Go bridge does not know and ignores; it still counts every entry
that is not ``failed`` against its daily cap, and keeps the entries when it
rewrites the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brmcp.bridge.pay import SPEND_FILE, SpendLog
from brmcp.testing import Fabric

from .live import BOT, FORTUNE_PRICE, PER_DAY_CAP, START, agent, go_bridge, py_harness

pytestmark = pytest.mark.interop

KEY = "0123456789abcdef0123456789abcdef"


async def test_the_go_bridge_reads_and_counts_our_entries_with_call_keys(
    tmp_path: Path, goref_binary: Path
) -> None:
    data_dir = tmp_path / "bridge"
    data_dir.mkdir()
    log = SpendLog(data_dir / SPEND_FILE)
    # Paid, in doubt (pending, may still land), failed, and a prepayment: all
    # but the failed one count, and together they leave exactly one fortune
    # of the Go bridge's daily cap.
    counted = PER_DAY_CAP - FORTUNE_PRICE
    first = counted - 3 * 1000
    may_land = "tip cannot complete now: x; brclient retries it later, so it may still land"
    for atoms, status, err, prepay in (
        (first, "paid", "", False),
        (1000, "pending", may_land, False),
        (5000, "failed", "no route", False),
        (2000, "paid", "", True),
    ):
        ticket = log.launch(ts=START, bot=BOT, tool="fortune", atoms=atoms, prepay=prepay, call_key=KEY)
        log.finish(ticket, status, err)
    log.write(log.prepare(START))
    ours = json.loads((data_dir / SPEND_FILE).read_text())
    assert {e["callKey"] for e in ours} == {KEY}
    assert log.day_total(START) == counted
    async with (
        Fabric() as fabric,
        py_harness(fabric, tmp_path / "bot") as harness,
        go_bridge(fabric, goref_binary, data_dir, harness) as theirs,
        agent(theirs.url) as s,
    ):
        # The Go bridge counted our entries: one fortune fills its cap
        # exactly (allowed), a second would pass it.
        assert not (await s.call_tool("fortune", {})).is_error
        second = await s.call_tool("fortune", {})
        assert second.is_error
        text = " ".join(c.text for c in second.content if c.type == "text")
        assert f"would exceed the daily cap ({PER_DAY_CAP} spent of {PER_DAY_CAP})" in text
        assert theirs.pays == [(BOT, FORTUNE_PRICE)]
    rewritten = json.loads((data_dir / SPEND_FILE).read_text())
    # Go kept our entries (without the keys it does not know) and appended its own.
    assert rewritten[: len(ours)] == [
        {k: v for k, v in e.items() if k not in ("callKey", "prepay")} for e in ours
    ]
    assert [(e["atoms"], e["status"]) for e in rewritten[len(ours) :]] == [(FORTUNE_PRICE, "paid")]
