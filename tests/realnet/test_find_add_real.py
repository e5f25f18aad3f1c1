"""``brmcp-bridge find`` and ``add`` on a real Bison Relay network (brnet):
a consumer reaches a provider it has never KX'd with using only the
bridge's commands (BRIDGE.md §Finding bots through directories), recorded
as a transcript (every command, its exit status, its output, its wall time;
the agents' token and the admin token replaced) printed at the end and
written to ``<tmp>/transcript.txt``. Run with ``-s`` to see it.

The users are those of tests/realnet/test_directory_real.py: ``dir`` runs
``brmcpdir``, ``prov`` runs ``brmcp-serve`` with a ``directory`` block,
``cons`` runs ``brmcp-bridge`` and is the directory's admin; dir has KX'd
with both, prov and cons have not.

1. prov registers at dir and pays by tip; dir crawls it and pays the test
   call; the admin (cons's agent, on dir) approves: prov is listed;
2. ``brmcp-bridge settings set directories=<dir>``, then ``brmcp-bridge
   find fortune`` prints prov's fortune with its price and verification;
3. ``brmcp-bridge add <prov>`` asks dir's ``introduce``; the user accepts
   the KX suggestion on cons's brclient (the log line it prints, then
   ``/mi``: ``ChatService.MediateKX``); ``add`` sees the exchange, allows
   prov and prints the agent configuration;
4. an official SDK agent on the printed URL and header calls ``fortune``
   (paid), and the books of all three agree to the atom;
5. ``brmcp-bridge receipts`` shows the fortune's signed receipt, checked;
   ``brmcp-bridge rate`` turns it into a rating at dir, once: the same
   receipt again is refused, and dir's ``get_provider`` shows the rating
   next to its paid-test history."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import ByteReceiveStream

from brmcp.bridge import ADMIN_TOKEN_FILE
from brmcp.bridge.find import RECEIPTS_FILE, ReceiptBook
from brmcp.testing.brnet import BrNet, mediated_kx

from .dirstack import (
    bridge_url,
    open_scenario,
    payload,
    poll,
    read_books,
    read_registration_state,
    start_directory_and_bridge,
    start_provider,
    suggestion_seen,
)
from .stack import FORTUNE_ATOMS, TOKEN, Daemon, agent

pytestmark = [pytest.mark.realnet, pytest.mark.slow]

LISTING_FEE = 1_000
TEST_BUDGET = 15_000
#: Wall seconds ``add`` may wait for the key exchange (its --kx-timeout).
KX_WAIT = 120


@dataclass
class Transcript:
    """What a user would have seen, in order: notes (``#``), commands
    (``$``) with their output, and each command's exit status and wall
    seconds. ``secrets`` are replaced by their labels, ``paths`` by theirs,
    before anything is kept."""

    secrets: dict[str, str] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def clean(self, text: str) -> str:
        for secret, label in self.secrets.items():
            text = text.replace(secret, label)
        # Any bearer value left (a token minted by the daemon, not passed in).
        text = re.sub(r"Bearer [0-9A-Za-z_-]{16,}", "Bearer <agent token>", text)
        for path, label in sorted(self.paths.items(), key=lambda p: -len(p[0])):
            text = text.replace(path, label)
        return text

    def note(self, text: str) -> None:
        self.lines.extend(self.clean(f"# {line}") for line in text.splitlines())

    def command(self, argv: list[str], rc: int, stdout: str, stderr: str, seconds: float) -> None:
        self.lines.append(self.clean("$ " + shlex.join(argv)))
        self.lines.extend(self.clean(line) for line in stdout.splitlines())
        self.lines.extend(self.clean(f"[stderr] {line}") for line in stderr.splitlines())
        self.lines.append(f"[exit {rc}, {seconds:.2f} s]")

    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass(frozen=True, slots=True)
class Run:
    """One finished command: exit status, decoded output, wall seconds."""

    rc: int
    stdout: str
    stderr: str
    seconds: float


def bridge_argv(datadir: Path, *args: str) -> tuple[list[str], list[str]]:
    """The ``brmcp-bridge`` command line to run (``python -m brmcp.bridge``)
    and the one to show (``brmcp-bridge``)."""
    tail = ["--datadir", str(datadir), *args]
    return [sys.executable, "-m", "brmcp.bridge", *tail], ["brmcp-bridge", *tail]


async def run_bridge(transcript: Transcript, datadir: Path, *args: str) -> Run:
    """Run one ``brmcp-bridge`` command to its end and record it."""
    argv, shown = bridge_argv(datadir, *args)
    began = time.monotonic()
    done = await anyio.run_process(argv, check=False)
    run = Run(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        time.monotonic() - began,
    )
    transcript.command(shown, run.rc, run.stdout, run.stderr, run.seconds)
    return run


async def _collect(stream: ByteReceiveStream | None, into: list[bytes]) -> None:
    if stream is None:
        return
    async for chunk in stream:
        into.append(chunk)


def suggestion_line(log: Path, target_uid: str) -> str:
    """brclient's log line for the KX suggestion toward ``target_uid``
    (:func:`suggestion_seen` is true), from its message on."""
    for line in log.read_text(errors="replace").splitlines():
        if "Received suggestion to KX" in line and target_uid in line:
            return line[line.index("Received suggestion to KX") :]
    raise AssertionError(f"no KX suggestion toward {target_uid} in {log}")


def agent_config(stdout: str) -> tuple[str, str]:
    """The ``url`` and ``Authorization`` header of the one server in the
    ``.mcp.json`` document ``add`` printed (between its ``# .mcp.json``
    line and the next blank line)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# .mcp.json")) + 1
    end = lines.index("", start)
    servers = json.loads("\n".join(lines[start:end]))["mcpServers"]
    assert len(servers) == 1, servers
    (server,) = servers.values()
    assert server["type"] == "http", server
    return str(server["url"]), str(server["headers"]["Authorization"])


async def test_find_add_and_a_paid_call_on_a_real_relay(
    brnet_factory: Callable[..., BrNet], tmp_path: Path
) -> None:
    sc = await open_scenario(brnet_factory, tmp_path, listing_fee=LISTING_FEE, test_budget=TEST_BUDGET)
    net, d, prov, cons, report = sc.net, sc.d, sc.prov, sc.cons, sc.report
    dir_data, prov_data, bridge_data = sc.dir_data, sc.prov_data, sc.bridge_data
    transcript = Transcript(secrets={TOKEN: "<agent token>"}, paths={str(tmp_path): "$TMP"})
    transcript.note(
        f"dir  = {d.uid} (brmcpdir)\nprov = {prov.uid} (brmcp-serve)\ncons = {cons.uid} (brmcp-bridge)"
    )
    daemons: list[Daemon] = []
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(sc.log.run, [d, prov, cons])
            await start_directory_and_bridge(sc, daemons)
            admin_token = (bridge_data / ADMIN_TOKEN_FILE).read_text().strip()
            if admin_token:
                transcript.secrets[admin_token] = "<admin token>"
            dir_url = bridge_url(bridge_data, d.uid)

            async def listed() -> None:
                daemons.append(start_provider(net, prov, cons, prov_data, sc.block))
                await poll(
                    lambda: read_registration_state(dir_data, prov.uid) == "pending_review",
                    "prov to register, fund, and pass dir's test call (pending_review)",
                    300,
                    daemons,
                )
                with anyio.fail_after(120):
                    async with agent(dir_url) as s:
                        status = payload(await s.call_tool("approve", {"uid": prov.uid}))
                assert status["state"] == "listed", status
                transcript.note(
                    "prov registered at dir, paid by tip, passed dir's paid test call; "
                    "the admin approved it: listed"
                )

            await report.step("1 prov registers, is tested, approved", listed)

            async def found() -> None:
                done = await run_bridge(transcript, bridge_data, "settings", "set", f"directories={d.uid}")
                assert done.rc == 0, done
                done = await run_bridge(transcript, bridge_data, "find", "fortune")
                assert done.rc == 0, done
                first = f"{prov.uid}  fortune  {FORTUNE_ATOMS:,} atoms  [fun]"
                assert first in done.stdout.splitlines(), done.stdout
                claim = next(line for line in done.stdout.splitlines() if "said by directory" in line)
                assert claim.startswith(
                    f"    said by directory {d.uid}: {FORTUNE_ATOMS:,} atoms, verified "
                ), claim
                assert "catalog checked never" not in claim, claim
                assert done.stdout.rstrip().endswith("reach one with: brmcp-bridge add <provider uid>"), done
                assert done.stderr == "", done.stderr

            await report.step("2 settings set directories, find fortune", found)

            url_header: list[tuple[str, str]] = []

            async def added() -> None:
                url_header.append(
                    await _add(transcript, net, bridge_data, prov.uid, d.uid, cons.root, daemons)
                )

            await report.step("3 add: introduce, accept the KX, allow", added)

            async def paid_call() -> None:
                url, header = url_header[0]
                assert header == f"Bearer {TOKEN}", "add printed another token than the bridge's"
                assert url == bridge_url(bridge_data, prov.uid), url
                with anyio.fail_after(180):
                    async with agent(url) as s:
                        tools = {t.name: t for t in (await s.list_tools()).tools}
                        fortune = payload(await s.call_tool("fortune", {}))
                assert tools["fortune"].meta == {"brmcp/priceAtoms": FORTUNE_ATOMS}, tools["fortune"]
                assert "fortune" in fortune, fortune
                transcript.note(
                    f"agent (MCP SDK) on {url}: tools/list -> {sorted(tools)}; "
                    f"tools/call fortune -> {json.dumps(fortune)[:120]}"
                )

            await report.step("4 agent: paid fortune call", paid_call)

            async def rated() -> None:
                def kept() -> bool:
                    book = ReceiptBook(bridge_data / RECEIPTS_FILE)
                    try:
                        return bool(book.list(prov.uid, 1))
                    finally:
                        book.close()

                await poll(kept, "the bridge to keep the fortune's signed receipt", 30, daemons)
                done = await run_bridge(transcript, bridge_data, "receipts")
                assert done.rc == 0, done
                (line,) = done.stdout.splitlines()
                assert f"  {prov.uid[:8]}  fortune  {FORTUNE_ATOMS:,} atoms  " in line, line
                assert line.endswith("  ok"), line
                receipt_id = line.split()[-2]
                done = await run_bridge(
                    transcript,
                    bridge_data,
                    "rate",
                    receipt_id,
                    "--stars",
                    "5",
                    "--comment",
                    "quick and right",
                )
                assert done.rc == 0, done
                assert f"directory {d.uid}: rated" in done.stdout, done.stdout
                again = await run_bridge(transcript, bridge_data, "rate", receipt_id, "--stars", "1")
                assert again.rc == 1, again
                assert "already used" in again.stderr, again.stderr
                with anyio.fail_after(120):
                    async with agent(dir_url) as s:
                        listing = payload(await s.call_tool("get_provider", {"uid": prov.uid}))
                reputation = listing["reputation"]
                assert reputation["ratings"] == 1, reputation
                assert reputation["ratedAtoms"] == FORTUNE_ATOMS, reputation
                assert reputation["paidTestsOk"] >= 1, reputation
                assert reputation["lastTests"][0]["ok"] is True, reputation
                transcript.note(
                    f"agent on dir: get_provider {prov.uid[:8]} -> reputation {json.dumps(reputation)}"
                )

            await report.step("5 receipts, rate the provider at dir", rated)

            books = await _check_books(net, dir_data, prov_data, bridge_data, d.uid, prov.uid, cons.uid)
            transcript.note(books)
            done = await run_bridge(transcript, bridge_data, "spend")
            assert done.rc == 0, done
            for daemon in daemons:
                assert daemon.proc is not None
                assert daemon.proc.poll() is None, daemon.tail(30)
            tg.cancel_scope.cancel()
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
        text = transcript.text() + "\n\n" + report.report()
        (tmp_path / "transcript.txt").write_text(text + "\n")
        print("\n" + text)


async def _add(
    transcript: Transcript,
    net: BrNet,
    bridge_data: Path,
    prov_uid: str,
    dir_uid: str,
    cons_root: Path,
    daemons: list[Daemon],
) -> tuple[str, str]:
    """Run ``add`` while acting as the user at cons's brclient: once ``add``
    says to accept the suggestion and brclient logged it, ``/mi`` through
    dir. Returns the URL and header of the printed agent configuration."""
    argv, shown = bridge_argv(bridge_data, "add", prov_uid, "--kx-timeout", str(KX_WAIT))
    out: list[bytes] = []
    err: list[bytes] = []
    seen = kx_done = 0.0
    line = "(add ended before the suggestion)"
    began = time.monotonic()
    async with await anyio.open_process(argv) as proc, anyio.create_task_group() as tg:
        tg.start_soon(_collect, proc.stdout, out)
        tg.start_soon(_collect, proc.stderr, err)
        await poll(
            lambda: b"accept the KX suggestion" in b"".join(err) or proc.returncode is not None,
            "add to ask for the introduction",
            120,
            daemons,
        )
        brclient_log = cons_root / "logs" / "brclient.log"
        if proc.returncode is None:
            await poll(
                lambda: suggestion_seen(brclient_log, prov_uid),
                "cons's brclient to receive the KX suggestion",
                60,
                daemons,
            )
            seen = time.monotonic() - began
            line = await anyio.to_thread.run_sync(suggestion_line, brclient_log, prov_uid)
            with anyio.fail_after(120):
                await mediated_kx(net, "cons", "dir", "prov")
            kx_done = time.monotonic() - began
        with anyio.fail_after(KX_WAIT + 60):
            rc = await proc.wait()
    seconds = time.monotonic() - began
    stdout, stderr = b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace")
    transcript.command(shown, rc, stdout, stderr, seconds)
    assert rc == 0, (stdout, stderr)
    transcript.note(
        f"meanwhile, on cons's brclient: at {seen:.2f} s its log showed: {line}\n"
        f"the user typed: /mi {dir_uid} {prov_uid} (ChatService.MediateKX); "
        f"KXCompleted at cons and prov at {kx_done:.2f} s"
    )
    assert f"directory {dir_uid} sent your brclient a KX suggestion toward {prov_uid}" in stderr, stderr
    assert f"key exchange with {prov_uid} completed" in stderr, stderr
    assert f"allowed {prov_uid}" in stderr, stderr
    return agent_config(stdout)


async def _check_books(
    net: BrNet,
    dir_data: Path,
    prov_data: Path,
    bridge_data: Path,
    dir_uid: str,
    prov_uid: str,
    cons_uid: str,
) -> str:
    """The books of dir, prov and cons agree to the atom; returns them as text."""
    books = await read_books(net, dir_data, prov_data, bridge_data, dir_uid, prov_uid, cons_uid)
    spend, at_dir, cons_at_dir, dir_paid = books.spend, books.at_dir, books.cons_at_dir, books.dir_paid
    fund, dir_at_prov, cons_at_prov, wallet = books.fund, books.dir_at_prov, books.cons_at_prov, books.wallet
    fund_shown = [(e["directoryUid"][:8], e["atoms"]) for e in fund]
    spend_shown = [(e["bot"][:8], e.get("tool", ""), e["atoms"], e.get("status", "paid")) for e in spend]
    text = (
        "books (atoms):"
        f"\n  dir:  prov's account {at_dir}; payments out to prov {dir_paid}; cons's account {cons_at_dir}"
        f"\n  prov: regfund.json {fund_shown}; dir's account {dir_at_prov}; cons's account {cons_at_prov}"
        f"\n  cons: bridge spend log {spend_shown}"
        f"\n  simulated wallet (matoms): {sorted(wallet)}"
    )

    # dir: prov's tips = listing fee + escrow left + the test paid out; cons
    # paid dir nothing (search and introduce are free by default).
    test_paid = sum(atoms for atoms, state, escrow in dir_paid if escrow and state == "paid")
    assert test_paid == FORTUNE_ATOMS, text
    assert at_dir.kind("directory_fee") == -LISTING_FEE, text
    assert at_dir.kind("directory_test") == -test_paid, text
    assert at_dir.kind("tip") == LISTING_FEE + at_dir.balance + test_paid, text
    assert at_dir.balance == TEST_BUDGET - FORTUNE_ATOMS, text
    assert (cons_at_dir.kinds, cons_at_dir.balance) == ({}, 0), text

    # prov: the fund tip out = what dir credited; dir's tip in = the test's charge.
    fund_out = sum(int(e["atoms"]) for e in fund if e["directoryUid"] == dir_uid)
    assert [e["directoryUid"] for e in fund] == [dir_uid], text
    assert fund_out == at_dir.kind("tip") == LISTING_FEE + TEST_BUDGET, text
    assert dir_at_prov.kind("tip") == test_paid, text
    assert -dir_at_prov.kind("charge") - dir_at_prov.kind("refund") == FORTUNE_ATOMS, text
    assert dir_at_prov.balance == 0, text

    # cons: the spend log = prov's charge + cons's balance at prov, all to prov.
    paid = [e for e in spend if e.get("status", "paid") == "paid"]
    assert {e["bot"].lower() for e in spend} == {prov_uid}, text
    spent = sum(int(e["atoms"]) for e in paid)
    charged = -cons_at_prov.kind("charge") - cons_at_prov.kind("refund")
    assert cons_at_prov.kind("tip") == spent, text
    assert spent == charged + cons_at_prov.balance, text
    assert charged == FORTUNE_ATOMS, text

    # The wallet paid exactly those payments, to the milliatom.
    assert sorted(wallet) == sorted(
        [fund_out * 1000, test_paid * 1000, *(int(e["atoms"]) * 1000 for e in paid)]
    ), text
    return text
