"""A bot pool on a real Bison Relay network (WIRE.md §Pools; BRIDGE.md
§Bot pools): three brmcp-serve members (three brnet users, one ``pool``
block, one PostgreSQL book from :mod:`brmcp.testing.pgserver`, one tool
``slow`` from a stdio upstream at 10,000 atoms), one brmcp-bridge on a
fourth user that allows every member, agents at each member's endpoint.

The bridge pays member A through a paid call there (and its prepayment);
a paid call at B's endpoint is charged from the shared balance with no tip;
a tip to B funds calls at every member; every member announces the same
``brmcp/pool`` id and key; the bridge learns the pool and spreads the calls
of every endpoint over the members; member C is stopped (SIGTERM, or
SIGKILL) in the middle of concurrent paid calls, the bridge fails the calls
of C's endpoint over to A and B with the same callKeys, every call gets
its result or, for a call C was running, its refund, and C is restarted.
The book is exact to the atom: tips paid = tips credited = net charges +
balance, every callKey charged once, nothing left charged, and every
charge is a result an agent got or a call C ran to its end before it
stopped (the agent's answer lost with C)."""

from __future__ import annotations

import functools
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from brmcp.bridge import Settings
from brmcp.bridge.daemon import read_runtime
from brmcp.protocol.receipts import ReceiptSigner, signed_receipt_from_meta, verify_receipt
from brmcp.server.pool import POOL_META_KEY, PoolConfig
from brmcp.testing.brnet import BrNet, BrNetUser

from .stack import (
    FORTUNE_ATOMS,
    TOKEN,
    Daemon,
    PoolBooks,
    agent,
    kill,
    pm_router,
    pool_books,
    pool_receipt_key,
    spend_entries,
    start_bridge,
    start_pool_member,
    wallet_tips,
)

pytestmark = [pytest.mark.realnet, pytest.mark.slow]

MEMBERS = ("pa", "pb", "pc")
POOL_ID = "fortunes"
#: Alice's direct tip to member B before the concurrent run (atoms): 50 paid calls.
TOPUP = 50 * FORTUNE_ATOMS
AGENTS_PER_MEMBER = 3
CALLS_EACH = 5
REFUNDED_TEXT = "the charge was refunded"
#: Seconds each paid call of the concurrent run takes at the member, so
#: that C has calls charged and running when it stops.
RUN_SECONDS = 3.0
#: The members' upstream (README "Sell an MCP server you already have"):
#: one paid tool, ``slow``, answering after ``seconds``.
UPSTREAM = """\
import anyio
from mcp.server import MCPServer

server = MCPServer("slow")


async def slow(seconds: float = 0.0) -> str:
    await anyio.sleep(seconds)
    return "a fortune, slowly"


server.add_tool(slow, name="slow")
server.run()
"""
PRICES = json.dumps({"tools": {"slow": FORTUNE_ATOMS}})


async def _until(condition: Callable[[], Any], what: str, limit: float = 120.0) -> Any:
    """Poll ``condition`` in a thread (it may block on I/O) until it returns
    a true value, and return it; fail naming ``what`` after ``limit`` s."""
    deadline = time.monotonic() + limit
    while True:
        value = await anyio.to_thread.run_sync(condition)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}")
        await anyio.sleep(0.2)


def _log_text(datadir: Path, name: str) -> str:
    """What the daemon wrote to ``<datadir>/<name>.out`` (every start appends)."""
    try:
        return (datadir / f"{name}.out").read_text(errors="replace")
    except OSError:
        return ""


def _serving(daemon: Daemon, datadir: Path, starts: int) -> bool:
    if daemon.proc is None or daemon.proc.poll() is not None:
        raise AssertionError(f"brmcp-serve in {datadir} exited:\n{daemon.tail()}")
    return _log_text(datadir, "serve").count("serving as ") >= starts


def _ok(result: CallToolResult | BaseException) -> bool:
    return isinstance(result, CallToolResult) and not result.is_error


def _answer_text(result: CallToolResult | BaseException) -> str:
    """A tool result's content as JSON text, or an error's message."""
    if isinstance(result, CallToolResult):
        return json.dumps([c.model_dump(mode="json") for c in result.content])
    return str(result)


def _receipt(result: CallToolResult, key_hex: str, members: set[str]) -> tuple[str, str]:
    """``(callKey, bot)`` of a paid result's signed receipt, checked against
    the pool's key and naming one of ``members`` as the bot that served it."""
    signed = signed_receipt_from_meta(result.meta)
    assert signed is not None, result.meta
    claims = verify_receipt(signed, key_hex)
    assert claims.bot in members, (claims.bot, members)
    assert claims.atoms == FORTUNE_ATOMS
    return claims.call_key, claims.bot


async def _pool_meta(probe: BrNetUser, uid: str) -> dict[str, Any]:
    """The ``_meta`` of ``uid``'s ``tools/list`` answer, over a session of
    the probe's own (the bridge keeps a bot's list ``_meta`` to itself)."""
    async with pm_router(probe) as router:
        conn = router.dial(uid)
        try:
            async with ClientSession(conn.read_stream, conn.write_stream) as session:
                with anyio.fail_after(90):
                    await session.initialize()
                    page = await session.list_tools()
        finally:
            conn.close()
    assert isinstance(page.meta, dict), page
    return dict(page.meta)


def _reload(bridge: Daemon, bridge_dir: Path, settings: Settings) -> int:
    """Write ``settings`` to the bridge's ``mcpclient.json`` and SIGHUP it;
    returns how many reloads its log showed before."""
    before = _log_text(bridge_dir, "bridge").count("reloaded settings")
    (bridge_dir / "mcpclient.json").write_text(settings.to_json())
    assert bridge.proc is not None
    bridge.proc.send_signal(signal.SIGHUP)
    return before


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
async def test_pool_of_three_shares_one_book_and_survives_a_member_stopping(
    brnet_factory: Callable[..., BrNet], tmp_path: Path, postgres_url: str, stop: str
) -> None:
    net = await anyio.to_thread.run_sync(lambda: brnet_factory(users=(*MEMBERS, "alice", "probe")))
    users = {nick: net.user(nick) for nick in MEMBERS}
    uids = {nick: u.uid for nick, u in users.items()}
    alice, probe = net.user("alice"), net.user("probe")
    pool = PoolConfig(POOL_ID, tuple(uids[n] for n in MEMBERS))
    key_file = pool_receipt_key(tmp_path / "poolkey")
    key_hex = ReceiptSigner.load_or_create(key_file).public_hex
    dirs = {nick: tmp_path / nick for nick in MEMBERS}
    script = tmp_path / "upstream.py"
    script.write_text(UPSTREAM)
    members = {
        nick: start_pool_member(
            users[nick],
            [alice.uid, probe.uid],
            dirs[nick],
            postgres_url,
            pool,
            key_file,
            upstream=[sys.executable, str(script)],
            prices=PRICES,
        )
        for nick in MEMBERS
    }
    bridge_dir = tmp_path / "bridge"
    settings = Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=20_000,
        per_day_cap_atoms=1_000_000,
        allowed_bots=tuple(uids[n] for n in MEMBERS),
        prepay_bots=(uids["pa"],),
    )
    bridge = start_bridge(
        alice, users["pa"], bridge_dir, allowed_bots=settings.allowed_bots, prepay_bots=settings.prepay_bots
    )
    try:
        await _scenario(
            _Pool(
                net, members, dirs, bridge, bridge_dir, settings, uids, alice, probe, key_hex, postgres_url
            ),
            stop,
        )
    finally:
        bridge.stop()
        for daemon in members.values():
            daemon.stop()


@dataclass
class _Pool:
    net: BrNet
    members: dict[str, Daemon]
    dirs: dict[str, Path]
    bridge: Daemon
    bridge_dir: Path
    settings: Settings
    uids: dict[str, str]
    alice: BrNetUser
    probe: BrNetUser
    key_hex: str
    store: str


async def _scenario(p: _Pool, stop: str) -> None:
    net, members, dirs, bridge, bridge_dir = p.net, p.members, p.dirs, p.bridge, p.bridge_dir
    settings, uids, alice, probe, key_hex, store = p.settings, p.uids, p.alice, p.probe, p.key_hex, p.store
    assert bridge.proc is not None
    pid = bridge.proc.pid
    await _until(lambda: (read_runtime(bridge_dir) or {}).get("pid") == pid, "the bridge to listen", 60)
    base = str((read_runtime(bridge_dir) or {})["url"])
    url = {nick: f"{base}/mcp/{uid}" for nick, uid in uids.items()}
    for nick in MEMBERS:
        await _until(functools.partial(_serving, members[nick], dirs[nick], 1), f"member {nick} to serve", 90)

    def books() -> PoolBooks:
        return pool_books(store, alice.uid)

    pool_uids = set(uids.values())

    # Every member announces the one pool: same id, same members, the key it signs with.
    for nick in MEMBERS:
        meta = await _pool_meta(probe, uids[nick])
        assert meta["brmcp/receiptKey"] == key_hex
        assert meta[POOL_META_KEY] == {"id": POOL_ID, "members": [uids[n] for n in MEMBERS], "key": key_hex}

    with anyio.fail_after(240):
        # The bridge pays member A through a paid call there, then tops up (prepay).
        async with agent(url["pa"]) as session:
            first = await session.call_tool("slow", {"seconds": 0})
        assert not first.is_error, first
        early = {_receipt(first, key_hex, pool_uids)[0]}
        await _until(
            lambda: (b := books()).credited == 2 * FORTUNE_ATOMS and b.balance == FORTUNE_ATOMS,
            "the call's tip and the prepayment to be credited",
        )
        await _until(
            lambda: [e.get("status") for e in spend_entries(bridge_dir)] == ["paid", "paid"],
            "the bridge's spend log to show both payments paid",
        )
        assert {e["bot"] for e in spend_entries(bridge_dir)} == {uids["pa"]}
        assert wallet_tips(net) == (2, 2 * FORTUNE_ATOMS)

        # Approval mode from now on: the bridge pays nothing without asking,
        # so every later charge comes from the shared balance.
        before = _reload(bridge, bridge_dir, settings.replace(mode="approval", prepay_bots=None))
        await _until(
            lambda: _log_text(bridge_dir, "bridge").count("reloaded settings") > before,
            "the bridge to reload its settings",
            30,
        )
        async with agent(url["pb"]) as session:
            second = await session.call_tool("slow", {"seconds": 0})
        assert not second.is_error, second
        early.add(_receipt(second, key_hex, pool_uids)[0])
        settled = books()
        assert (settled.credited, settled.charges, settled.balance) == (
            2 * FORTUNE_ATOMS,
            2 * FORTUNE_ATOMS,
            0,
        )
        assert wallet_tips(net) == (2, 2 * FORTUNE_ATOMS)  # no tip for the call at B
        assert len(spend_entries(bridge_dir)) == 2

        # A tip to member B funds calls at every member.
        async with alice.client(backoff_initial=0.05, backoff_max=0.2, ping_interval=None) as client:
            await client.wait_connected()
            await client.tip_user(uids["pb"], TOPUP / 1e8, 3)
        await _until(lambda: books().balance == TOPUP, "alice's tip to member B to be credited")
    assert books().tips == 3

    # Concurrent paid calls at all three endpoints, spread over the members;
    # C stops after the first answer at its endpoint.
    results: dict[str, list[CallToolResult | BaseException]] = {nick: [] for nick in MEMBERS}
    c_answered = anyio.Event()
    c_stopped = anyio.Event()

    async def calls(nick: str, session: ClientSession) -> None:
        for _ in range(CALLS_EACH):
            try:
                result: CallToolResult | BaseException = await session.call_tool(
                    "slow", {"seconds": RUN_SECONDS}
                )
            except MCPError as exc:
                result = exc
            results[nick].append(result)
            if nick == "pc":
                c_answered.set()

    async def stopper() -> None:
        await c_answered.wait()
        if stop == "sigkill":
            kill(members["pc"])
        else:
            await anyio.to_thread.run_sync(members["pc"].stop)
        c_stopped.set()

    async def pinned(nick: str) -> None:
        async with agent(url[nick], read_timeout=600) as session:
            await calls(nick, session)

    with anyio.fail_after(420):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stopper)
            for nick in MEMBERS:
                for _ in range(AGENTS_PER_MEMBER):
                    tg.start_soon(pinned, nick)

            # Every call at every endpoint, C's included, is answered while C
            # is down: the bridge fails over to A and B with the same callKey.
            total = AGENTS_PER_MEMBER * CALLS_EACH
            await c_stopped.wait()
            await _until(
                lambda: all(len(results[nick]) == total for nick in MEMBERS),
                "every call at every endpoint to be answered",
                300,
            )
            for nick in MEMBERS:
                for result in results[nick]:
                    assert isinstance(result, CallToolResult), result
                    assert not result.is_error or REFUNDED_TEXT in _answer_text(result), result
            # C's calls charged when it stopped are refunded (by C's own
            # shutdown, or by a sibling that sees its process gone) once.
            await _until(lambda: books().open_calls == 0, "no call left charged after C stopped", 60)
            books().check()

            # C comes back: the copies held for it while it was away are
            # duplicates of calls already answered, never charged again.
            members["pc"].start()
            await _until(lambda: _serving(members["pc"], dirs["pc"], 2), "member C to serve again", 90)

    refused = [r for nick in MEMBERS for r in results[nick] if not _ok(r)]
    meta = await _pool_meta(probe, uids["pc"])
    assert meta[POOL_META_KEY]["key"] == key_hex

    # The book, exact to the atom across the shared database: tips paid =
    # tips credited = net charges + balance, every callKey charged once.
    await _until(lambda: books().open_calls == 0, "the book to settle", 60)
    final = books()
    final.check()
    assert wallet_tips(net) == (3, 2 * FORTUNE_ATOMS + TOPUP)
    assert final.tips == 3
    assert final.credited == 2 * FORTUNE_ATOMS + TOPUP
    assert [e.get("status") for e in spend_entries(bridge_dir)] == ["paid", "paid"]
    served = {
        nick: [r for r in results[nick] if isinstance(r, CallToolResult) and not r.is_error]
        for nick in MEMBERS
    }
    receipts = [_receipt(r, key_hex, pool_uids) for nick in MEMBERS for r in served[nick]]
    got = {key for key, _ in receipts}
    n_served = sum(len(v) for v in served.values())
    assert len(got) == n_served  # one callKey per logical call
    # The calls were spread: more than one member served the run's results.
    assert len({bot for _, bot in receipts}) >= 2, receipts
    charged = {k for k in final.charges_per_key if final.refunds_per_key.get(k, 0) == 0}
    refunded = set(final.refunds_per_key)
    assert got <= charged
    assert not refunded & got
    assert final.charges == len(charged) * FORTUNE_ATOMS
    # Beyond the two calls before the run and the results agents got, a
    # charge is a call that ran to its end at C before C stopped, whose
    # answer was lost with C: settled (done), never refunded. Each refused
    # call at C is one of those, a refunded one, or one never charged.
    assert early <= charged
    lost = charged - got - early
    assert all(final.call_states.get(k) == "done" for k in lost), final.call_states
    # Each refused call is one C was running when it stopped, refunded once;
    # a call C ran to its end is replayed to the agent by the member the
    # bridge failed over to, so no charged result is lost.
    assert len(refused) == len(refunded), (len(refused), refunded)
    assert not lost, lost
