"""The directory scenario's pieces on brnet (tests/realnet/test_directory_real.py,
test_find_add_real.py): its users and data directories (:func:`open_scenario`),
the ``brmcpdir`` daemon on one user, ``brmcp-serve`` with a ``directory``
block on another, ``brmcp-bridge`` on the third, a PM log over every user's
PM stream, a per-step reporter, and the books of each daemon read from where
its money is recorded (SQLite ledgers read-only, ``regfund.json``, the
bridge's spend log through ``brmcp-bridge --json spend``).

Amounts are atoms; times are seconds (``time.monotonic``)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import pytest
from mcp.types import CallToolResult

from brmcp.bridge.daemon import read_runtime
from brmcp.clientrpc import write_bot_config
from brmcp.directory.provider import RegistrantConfig
from brmcp.serve.config import SERVE_CONFIG_FILE, ServeConfig, write_serve_config
from brmcp.testing.brnet import BrNet, BrNetUser
from tests.kit.clientrpc import FAST

from .stack import Daemon, start_bridge, start_serve

#: The database every harness (the directory's included) keeps its ledger in.
LEDGER_DB = "brmcp.sqlite3"


def start_directory(user: BrNetUser, datadir: Path, policy: dict[str, Any]) -> Daemon:
    """``brmcpdir`` (``python -m brmcp.directory``) on ``user``'s brclient:
    ``<datadir>/brmcpdir.conf`` is the user's conf with ``brstatusurl`` set
    to its status server (introductions on), ``<datadir>/brmcpdir.json``
    the ``policy`` object (brmcp/directory/model/_policy.py keys). Both files exist
    before the first run, so the daemon serves at once."""
    datadir.mkdir(parents=True, exist_ok=True)
    config = user.bot_config_for(datadir, "brmcpdir")
    config.brstatusurl = user.status_url
    write_bot_config(datadir / "brmcpdir.conf", config)
    (datadir / "brmcpdir.json").write_text(json.dumps(policy, indent=2))
    daemon = Daemon([sys.executable, "-m", "brmcp.directory", "--datadir", str(datadir)], datadir / "dir.out")
    daemon.start()
    return daemon


def start_provider(
    net: BrNet, bot: BrNetUser, caller: BrNetUser, datadir: Path, directory: dict[str, Any]
) -> Daemon:
    """``brmcp-serve`` on ``bot`` with the example tools, ``caller`` allowed
    and ``directory`` as the ``directory`` block of ``brmcp.json`` (README
    §List your bot); the file is written before the data directory is
    initialised, so it is the one the daemon reads."""
    datadir.mkdir(parents=True, exist_ok=True)
    block = RegistrantConfig.from_json(directory)
    write_serve_config(datadir / SERVE_CONFIG_FILE, ServeConfig(allowed_uids=(caller.uid,), directory=block))
    return start_serve(net, bot, caller, datadir)


# -- the scenario ----------------------------------------------------------------------

#: The scenario's users and its KX'd pairs: dir has KX'd with both, prov and
#: cons have not.
SCENARIO_USERS = ("dir", "prov", "cons")
SCENARIO_KX = (("dir", "prov"), ("dir", "cons"))


@dataclass
class Scenario:
    """The scenario's brnet and where each daemon keeps its data: ``d``
    runs ``brmcpdir`` (``dir_data``, its ``policy``), ``prov`` runs
    ``brmcp-serve`` (``prov_data``, ``block`` its ``directory`` block),
    ``cons`` runs ``brmcp-bridge`` (``bridge_data``) and is the directory's
    admin. ``log`` counts the PMs of all three, ``report`` times the steps."""

    net: BrNet
    d: BrNetUser
    prov: BrNetUser
    cons: BrNetUser
    dir_data: Path
    prov_data: Path
    bridge_data: Path
    policy: dict[str, Any]
    block: dict[str, Any]
    log: PMLog
    report: Reporter


async def open_scenario(
    brnet_factory: Callable[..., BrNet], tmp_path: Path, *, listing_fee: int, test_budget: int
) -> Scenario:
    """Start the scenario's brnet and lay out its daemons under
    ``tmp_path`` (``dir``, ``prov``, ``bridge``): the directory charges
    ``listing_fee`` atoms (policy name ``realnet-dir``), prov offers a
    ``fortune`` test call with a budget of ``test_budget`` atoms and funds
    its listing at dir under AutoFund. Skips the test when brnet has no
    status server (``introduce`` needs one)."""
    net = await anyio.to_thread.run_sync(lambda: brnet_factory(users=SCENARIO_USERS, kx=SCENARIO_KX))
    d, prov, cons = net.user("dir"), net.user("prov"), net.user("cons")
    if not d.status_url:
        pytest.skip(
            "this brnet build has no status server (brstatusurl), so introduce cannot run; rebuild brnet"
        )
    block = {
        "description": "fortunes and echoes on brnet",
        "tags": ["fun"],
        "test": {"tool": "fortune", "args": {}, "maxAtoms": test_budget},
        "auto_fund": {"enabled": True, "max_atoms_per_request": 100_000, "max_atoms_per_month": 1_000_000},
        "register_at_uids": [d.uid],
    }
    log = PMLog({d.uid: "dir", prov.uid: "prov", cons.uid: "cons"})
    return Scenario(
        net=net,
        d=d,
        prov=prov,
        cons=cons,
        dir_data=tmp_path / "dir",
        prov_data=tmp_path / "prov",
        bridge_data=tmp_path / "bridge",
        policy={"admin_uids": [cons.uid], "listing_fee_atoms": listing_fee, "name": "realnet-dir"},
        block=block,
        log=log,
        report=Reporter(net, log),
    )


async def start_directory_and_bridge(sc: Scenario, daemons: list[Daemon]) -> None:
    """Start ``brmcpdir`` on dir and ``brmcp-bridge`` on cons (for dir),
    appended to ``daemons`` in that order, and wait until the bridge
    serves."""
    daemons.append(start_directory(sc.d, sc.dir_data, sc.policy))
    bridge = start_bridge(sc.cons, sc.d, sc.bridge_data)
    daemons.append(bridge)
    await wait_bridge(sc.bridge_data, bridge)


async def wait_bridge(datadir: Path, bridge: Daemon) -> None:
    """Wait (60 s at most) until the bridge's runtime record names its
    process; fail with its output if it exits first."""
    assert bridge.proc is not None
    pid = bridge.proc.pid
    with anyio.fail_after(60):
        while (read_runtime(datadir) or {}).get("pid") != pid:
            if bridge.proc.poll() is not None:
                raise AssertionError(f"brmcp-bridge exited:\n{bridge.tail()}")
            await anyio.sleep(0.1)


def bridge_url(datadir: Path, bot_uid: str) -> str:
    """The running bridge's MCP endpoint for ``bot_uid``."""
    record = read_runtime(datadir)
    assert record is not None
    return f"{record['url']}/mcp/{bot_uid}"


def payload(result: CallToolResult) -> Any:
    """A tool result's JSON (structured content, else its text)."""
    assert not result.is_error, result
    if result.structured_content is not None:
        return result.structured_content
    text = "".join(getattr(c, "text", "") for c in result.content)
    return json.loads(text)


def suggestion_seen(log: Path, target_uid: str) -> bool:
    """Whether brclient logged a KX suggestion naming ``target_uid``
    (bisonrelay's ``handleKXSuggestion``: "Received suggestion to KX with ...";
    clientrpc has no stream for it)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return False
    return any("Received suggestion to KX" in line and target_uid in line for line in text.splitlines())


# -- counting PMs ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PM:
    """One PM as its receiver's brclient delivered it."""

    at: float
    sender: str
    receiver: str


@dataclass
class PMLog:
    """Every PM the given users receive, each user counted on its own
    clientrpc PM stream (as bench/realnet_scale.py counts them); ``names``
    maps uids to nicks for the report."""

    names: dict[str, str]
    pms: list[PM] = field(default_factory=list)

    async def run(self, users: list[BrNetUser], *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with contextlib.AsyncExitStack() as stack:
            subs = []
            for user in users:
                client = await stack.enter_async_context(user.client(**FAST))
                await client.wait_connected()
                sub = client.pm_stream()
                await sub.wait_open()
                subs.append((user.nick, sub))
            async with anyio.create_task_group() as tg:
                for nick, sub in subs:
                    tg.start_soon(self._drain, nick, sub)
                task_status.started()

    async def _drain(self, receiver: str, sub: Any) -> None:
        async for pm in sub:
            self.pms.append(PM(time.monotonic(), self.names.get(pm.uid, pm.uid[:8]), receiver))

    def since(self, start: int) -> list[PM]:
        return self.pms[start:]

    async def quiet(self, seconds: float = 1.0, limit: float = 15.0) -> None:
        """Return once no PM arrived for ``seconds`` (or after ``limit``
        seconds): the trailing PMs of a step (answers, session closes) are
        then counted in that step, not the next."""
        deadline = time.monotonic() + limit
        while True:
            now = time.monotonic()
            last = self.pms[-1].at if self.pms else 0.0
            if now - last >= seconds or now >= deadline:
                return
            await anyio.sleep(min(seconds - (now - last), deadline - now))


def simwallet_matoms(net: BrNet) -> list[int]:
    """Milliatoms of every invoice brnet's simulated wallet paid, in no
    particular order (the wallet does not record the payee)."""
    path = net.root / "simwallet.json"
    return [int(m) for m in json.loads(path.read_text()).values()] if path.exists() else []


@dataclass
class Step:
    """One measured step: wall seconds until its outcome, PMs received by
    each receiver from each sender (``"sender>receiver"``), tips the
    simulated wallet paid meanwhile (count and atoms)."""

    name: str
    seconds: float
    pms: dict[str, int]
    tips: int
    tip_atoms: int

    @property
    def total_pms(self) -> int:
        return sum(self.pms.values())


class Reporter:
    """Times the scenario's steps and prints one line per step (with the
    relay PMs by direction) and a total."""

    def __init__(self, net: BrNet, log: PMLog) -> None:
        self.net = net
        self.log = log
        self.steps: list[Step] = []

    async def step(self, name: str, work: Callable[[], Awaitable[None]], *, settle: bool = True) -> None:
        """Run ``work``; the step's time ends when it returns, its PMs and
        tips once the network is quiet afterwards (:meth:`PMLog.quiet`), or
        when it returns for a step the next one follows without a pause
        (``settle=False``: a pipeline that runs on by itself)."""
        first = len(self.log.pms)
        tips_before = await anyio.to_thread.run_sync(simwallet_matoms, self.net)
        began = time.monotonic()
        await work()
        seconds = time.monotonic() - began
        if settle:
            await self.log.quiet()
        tips_after = await anyio.to_thread.run_sync(simwallet_matoms, self.net)
        counts: dict[str, int] = {}
        for pm in self.log.since(first):
            key = f"{pm.sender}>{pm.receiver}"
            counts[key] = counts.get(key, 0) + 1
        new = len(tips_after) - len(tips_before)
        atoms = (sum(tips_after) - sum(tips_before)) // 1000
        self.steps.append(Step(name, seconds, dict(sorted(counts.items())), new, atoms))

    def report(self) -> str:
        lines = [f"{'step':<44}{'seconds':>9}{'PMs':>6}{'tips':>6}{'atoms':>8}  PMs by direction"]
        for s in self.steps:
            by = " ".join(f"{k}:{v}" for k, v in s.pms.items())
            lines.append(f"{s.name:<44}{s.seconds:>9.2f}{s.total_pms:>6}{s.tips:>6}{s.tip_atoms:>8}  {by}")
        total = sum(s.seconds for s in self.steps)
        pms = sum(s.total_pms for s in self.steps)
        tips = sum(s.tips for s in self.steps)
        atoms = sum(s.tip_atoms for s in self.steps)
        lines.append(f"{'total':<44}{total:>9.2f}{pms:>6}{tips:>6}{atoms:>8}")
        return "\n".join(lines)


# -- the books -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ledger:
    """One peer's account in a harness ledger: the summed movements by kind
    (tips credited positive, charges and directory debits negative) and the
    balance left."""

    kinds: dict[str, int]
    balance: int

    def kind(self, name: str) -> int:
        return self.kinds.get(name, 0)


def read_ledger(datadir: Path, peer: str) -> Ledger:
    """``peer``'s account in ``<datadir>/brmcp.sqlite3``, read-only (the
    daemon keeps running)."""
    db = sqlite3.connect(f"file:{datadir / LEDGER_DB}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT kind, COALESCE(SUM(atoms), 0) FROM movements WHERE peer = ? GROUP BY kind", (peer,)
        ).fetchall()
        bal = db.execute("SELECT atoms FROM balances WHERE peer = ?", (peer,)).fetchone()
    finally:
        db.close()
    return Ledger({str(k): int(v) for k, v in rows}, int(bal[0]) if bal else 0)


def read_registration_state(datadir: Path, uid: str) -> str:
    """The directory's pipeline state for ``uid`` (``""`` before any
    registration, or before the directory created its tables)."""
    path = datadir / LEDGER_DB
    if not path.exists():
        return ""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT state FROM dir_registrations WHERE uid = ?", (uid,)).fetchone()
    except sqlite3.OperationalError:
        return ""
    finally:
        db.close()
    return str(row[0]) if row else ""


def read_directory_spend(datadir: Path, uid: str) -> list[tuple[int, str, bool]]:
    """The directory's outbound payments to ``uid``: ``(atoms, state,
    escrowed)`` per journal row, oldest first."""
    db = sqlite3.connect(f"file:{datadir / LEDGER_DB}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT atoms, state, escrow FROM dir_spend WHERE uid = ? ORDER BY id", (uid,)
        ).fetchall()
    finally:
        db.close()
    return [(int(a), str(s), bool(e)) for a, s, e in rows]


def read_fund_history(datadir: Path) -> list[dict[str, Any]]:
    """The provider's ``regfund.json`` entries (``[]`` before the first payment)."""
    path = datadir / "regfund.json"
    if not path.exists():
        return []
    entries: list[dict[str, Any]] = json.loads(path.read_text())
    return entries


async def bridge_spend(datadir: Path) -> list[dict[str, Any]]:
    """The bridge's spend log, as ``brmcp-bridge --json spend`` prints it
    (the daemon's admin surface)."""
    done = await anyio.run_process(
        [sys.executable, "-m", "brmcp.bridge", "--datadir", str(datadir), "--json", "spend"], check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    entries: list[dict[str, Any]] = json.loads(done.stdout)["entries"]
    return entries


async def settled_spend(datadir: Path) -> list[dict[str, Any]]:
    """The bridge's spend log once it has entries and none is pending (the
    bridge writes it after the call returns); 30 s at most."""
    with anyio.fail_after(30):
        while True:
            entries = await bridge_spend(datadir)
            if entries and all(e.get("status", "paid") != "pending" for e in entries):
                return entries
            await anyio.sleep(0.2)


class Books(NamedTuple):
    """The scenario's books after the paid call (amounts in atoms, the
    wallet's in milliatoms): the bridge's settled spend log; at dir, prov's
    and cons's accounts and its payments out to prov; prov's
    ``regfund.json``; at prov, dir's and cons's accounts; the simulated
    wallet's payments."""

    spend: list[dict[str, Any]]
    at_dir: Ledger
    cons_at_dir: Ledger
    dir_paid: list[tuple[int, str, bool]]
    fund: list[dict[str, Any]]
    dir_at_prov: Ledger
    cons_at_prov: Ledger
    wallet: list[int]


async def read_books(
    net: BrNet, dir_data: Path, prov_data: Path, bridge_data: Path, dir_uid: str, prov_uid: str, cons_uid: str
) -> Books:
    """Read :class:`Books` from where each daemon records its money (files
    read in worker threads, the spend log through the bridge)."""
    spend = await settled_spend(bridge_data)
    return Books(
        spend=spend,
        at_dir=await anyio.to_thread.run_sync(read_ledger, dir_data, prov_uid),
        cons_at_dir=await anyio.to_thread.run_sync(read_ledger, dir_data, cons_uid),
        dir_paid=await anyio.to_thread.run_sync(read_directory_spend, dir_data, prov_uid),
        fund=await anyio.to_thread.run_sync(read_fund_history, prov_data),
        dir_at_prov=await anyio.to_thread.run_sync(read_ledger, prov_data, dir_uid),
        cons_at_prov=await anyio.to_thread.run_sync(read_ledger, prov_data, cons_uid),
        wallet=await anyio.to_thread.run_sync(simwallet_matoms, net),
    )


async def bridge_settings_set(datadir: Path, *assignments: str) -> dict[str, Any]:
    """``brmcp-bridge --json settings set KEY=VALUE...`` on the running
    daemon (BRIDGE.md §Admin surface); returns the applied settings."""
    done = await anyio.run_process(
        [
            sys.executable,
            "-m",
            "brmcp.bridge",
            "--datadir",
            str(datadir),
            "--json",
            "settings",
            "set",
            *assignments,
        ],
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    applied: dict[str, Any] = json.loads(done.stdout)
    return applied


async def poll(condition: Callable[[], bool], what: str, limit: float, daemons: list[Daemon]) -> None:
    """Check ``condition`` (in a worker thread: it reads files) every 0.1 s
    until true; fail naming ``what`` after ``limit`` seconds, or as soon as
    one of ``daemons`` exited, with the tail of its output."""
    deadline = time.monotonic() + limit
    while not await anyio.to_thread.run_sync(condition):
        for daemon in daemons:
            if daemon.proc is not None and daemon.proc.poll() is not None:
                raise AssertionError(f"{daemon.argv[2]} exited while waiting for {what}:\n{daemon.tail(30)}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {d.log.name}\n{d.tail(20)}" for d in daemons)
            raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}\n{tails}")
        await anyio.sleep(0.1)
