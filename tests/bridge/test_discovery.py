"""Finding bots through directories (brmcp/bridge/find/_discovery.py, the ``find``
and ``add`` commands in brmcp/bridge/cli/_findcli.py; BRIDGE.md §Finding bots
through directories): two real directories (brmcp.directory) with listed
providers on the in-memory fabric, a bridge whose ``directories`` setting
names them, the CLI against the bridge's admin surface, the spending policy
on priced searches, ``add`` with and without a key exchange, the KX source
over the fake brclient, and hostile directories that lie, flood, send huge
answers or never answer."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession

from brmcp import ManualClock
from brmcp.bridge import Bridge, Settings, cli
from brmcp.bridge.base import SettingsError
from brmcp.bridge.cli import parse_pairs
from brmcp.bridge.daemon import remove_runtime, write_runtime
from brmcp.bridge.find import ClientrpcContacts
from brmcp.directory import Directory, DirectoryConfig
from brmcp.directory.model import STATE_PENDING_REVIEW
from brmcp.protocol.receipts import ReceiptSigner
from brmcp.server import Harness
from brmcp.testing import Fabric
from brmcp.testing.fakebr import FakeBRClient, FakeRelay
from brmcp.testing.hostile import (
    Behaviour,
    HostileBot,
    HostileCall,
    HostileTool,
    KeyState,
    PriceSwitch,
    RefusalLoop,
    Reply,
    by_tool,
)
from tests.directory.stack import ADMIN, BUDGET, FAST, FEE, START, policy, provider_harness, register_args
from tests.kit import CLIENT, until
from tests.kit.bridge import TOKEN, fabric_bridge
from tests.kit.clientrpc import FAST as FAST_RPC


def huid(tag: str) -> str:
    """A test uid of its own (``uid(n)`` has only 16 distinct values)."""
    return hashlib.sha256(tag.encode()).hexdigest()


DIR_A = huid("directory a")
DIR_B = huid("directory b")
P1 = huid("provider 1")
P2 = huid("provider 2")
HOSTILE = huid("hostile directory")
STRANGER = huid("stranger")
#: The bridge's clock runs an hour after the directories verified their providers.
BRIDGE_NOW = START + 3600


class DirPayer:
    """A directory's payer: its test payments land at the provider's harness."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.harnesses: dict[str, Harness] = {}
        self.seq = 0

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.seq += 1
        await self.harnesses[payee_uid].credit_tip(self.me, atoms * 1000, self.seq)


@dataclass
class BridgePayer:
    """The bridge's payer: a tip credited at the directory (or hostile bot)
    paid; every payment is recorded."""

    directories: dict[str, Directory] = field(default_factory=dict)
    hostile: dict[str, HostileBot] = field(default_factory=dict)
    providers: dict[str, Harness] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)
    seq: int = 0

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.calls.append((payee_uid, atoms))
        self.seq += 1
        if payee_uid in self.directories:
            await self.directories[payee_uid].credit_tip(CLIENT, atoms * 1000, self.seq)
        elif payee_uid in self.providers:
            await self.providers[payee_uid].credit_tip(CLIENT, atoms * 1000, self.seq)
        else:
            self.hostile[payee_uid].ledger.credit(CLIENT, atoms)

    def paid_to(self, payee: str) -> int:
        return sum(atoms for who, atoms in self.calls if who == payee)


class FakeContacts:
    """The bridge's view of brclient's contacts: a set, and waits that end
    when :meth:`add` puts the uid in it."""

    def __init__(self, known: set[str]) -> None:
        self.known = set(known)
        self._changed = anyio.Event()

    def add(self, who: str) -> None:
        self.known.add(who)
        self._changed.set()
        self._changed = anyio.Event()

    async def is_contact(self, who: str) -> bool:
        return who in self.known

    async def wait_kx(self, who: str, wait_secs: float) -> bool:
        with anyio.move_on_after(wait_secs):
            while who not in self.known:
                await self._changed.wait()
            return True
        return False


@dataclass
class Suggester:
    """A directory's KX suggester; with ``accept`` the user "accepts" the
    suggestion at once (the KX completes: the provider becomes a contact)."""

    contacts: FakeContacts
    accept: bool = True
    sent: list[tuple[str, str]] = field(default_factory=list)

    async def suggest(self, invitee_uid: str, target_uid: str) -> None:
        self.sent.append((invitee_uid, target_uid))
        if self.accept:
            self.contacts.add(target_uid)


@dataclass
class World:
    fabric: Fabric
    bridge: Bridge
    payer: BridgePayer
    contacts: FakeContacts
    suggester: Suggester
    data_dir: Path
    directories: dict[str, Directory]
    stack: AsyncExitStack

    @property
    def base_url(self) -> str:
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}"

    def admin_http(self) -> httpx2.AsyncClient:
        headers = {"Authorization": f"Bearer {self.bridge.admin_token}"}
        return httpx2.AsyncClient(base_url=self.base_url, headers=headers, timeout=60)

    async def find(self, query: str = "", **body: Any) -> dict[str, Any]:
        async with self.admin_http() as http:
            response = await http.post("/admin/find", json={"query": query, **body})
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    async def cli(self, *argv: str) -> int:
        """Run ``brmcp-bridge --datadir <bridge> argv…`` against this bridge
        (in a thread: the command blocks on its HTTP requests)."""
        write_runtime(self.data_dir, listen=self.base_url[7:], url=self.base_url, sighup=False)
        code: int = await anyio.to_thread.run_sync(cli.main, ["--datadir", str(self.data_dir), *argv])
        return code


@asynccontextmanager
async def _session(router: Any, peer: str) -> AsyncIterator[ClientSession]:
    conn = router.dial(peer)
    async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=20) as session:
        await session.initialize()
        yield session


async def _ok(router: Any, peer: str, tool: str, args: dict[str, Any]) -> Any:
    async with _session(router, peer) as session:
        result = await session.call_tool(tool, args)
    assert not result.is_error, result
    return result.structured_content


async def _list(directory: Directory, at: str, provider: str, router: Any, admin: Any) -> None:
    """Register, fund, verify and approve ``provider`` at directory ``at``."""
    await _ok(router, at, "register", register_args())
    await directory.credit_tip(provider, (FEE + BUDGET) * 1000, int(provider[-4:], 16) + 1)

    async def parked() -> bool:
        return (await directory.pipeline.status(provider)).state == STATE_PENDING_REVIEW

    await until(parked)
    await _ok(admin, at, "approve", {"uid": provider})


def bridge_settings(**changes: Any) -> Settings:
    base = Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=10_000,
        per_day_cap_atoms=100_000,
        allowed_bots=(),
        directories=(DIR_A, DIR_B),
    )
    return base.replace(**changes)


@asynccontextmanager
async def world(
    tmp_path: Path,
    *,
    settings: Settings | None = None,
    search_price: int = 0,
    contacts: set[str] | None = None,
    hostile: HostileBot | None = None,
    clock: ManualClock | None = None,
    signers: dict[str, ReceiptSigner] | None = None,
) -> AsyncIterator[World]:
    """Directories at DIR_A (lists P1) and DIR_B (lists P1 and P2), their
    providers, and a bridge at CLIENT whose brclient knows the directories
    (``contacts``: who it knows instead); ``hostile`` is put on the fabric too;
    ``clock``: the bridge's (default: auto, at :data:`BRIDGE_NOW`);
    ``signers``: receipt keys of providers that sign receipts."""
    known = FakeContacts(contacts if contacts is not None else {DIR_A, DIR_B, HOSTILE})
    suggester = Suggester(known)
    payer = BridgePayer()
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        directories: dict[str, Directory] = {}
        dir_payers: dict[str, DirPayer] = {}
        for at in (DIR_A, DIR_B):
            dir_payers[at] = DirPayer(at)
            directory = Directory(
                DirectoryConfig(
                    tmp_path / at[:6],
                    policy(search_price_atoms=search_price),
                    dir_payers[at],
                    self_uid=at,
                    clock=ManualClock(START, auto=True),
                    timeouts=FAST,
                    sweep_interval=0,
                    suggester=suggester,
                )
            )
            await stack.enter_async_context(directory)
            router = await directory.start(fabric.sender(at))
            fabric.attach(at, router.handle_pm)
            directories[at] = directory
        admin = await stack.enter_async_context(fabric.router(ADMIN))
        for provider, where in ((P1, (DIR_A, DIR_B)), (P2, (DIR_B,))):
            harness, _runs = provider_harness(
                tmp_path / provider[:6], receipt_signer=(signers or {}).get(provider)
            )
            await stack.enter_async_context(harness)
            router = await harness.start(fabric.sender(provider))
            fabric.attach(provider, router.handle_pm)
            payer.providers[provider] = harness
            for at in where:
                dir_payers[at].harnesses[provider] = harness
                await _list(directories[at], at, provider, router, admin)
        if hostile is not None:
            await stack.enter_async_context(hostile)
            payer.hostile[hostile.uid] = hostile
        payer.directories = directories
        data_dir = tmp_path / "bridge"
        data_dir.mkdir()
        (data_dir / "mcpclient.json").write_text((settings or bridge_settings()).to_json())
        bridge = fabric_bridge(
            fabric, data_dir, payer, clock=clock or ManualClock(BRIDGE_NOW, auto=True), name="brmcp-bridge"
        )
        await stack.enter_async_context(bridge)
        bridge.use_contacts(known)
        yield World(fabric, bridge, payer, known, suggester, data_dir, directories, stack)


def _claims(found: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    return {(h["providerUid"], h["tool"]): [c["directory"] for c in h["claims"]] for h in found["hits"]}


# -- settings ----------------------------------------------------------------------------


def test_directories_setting_is_validated_written_only_when_set_and_reachable() -> None:
    assert "directories" not in Settings().to_dict()
    settings = Settings(allowed_bots=(P1,), directories=(DIR_A.upper(),))
    settings.validate()
    assert json.loads(settings.to_json())["directories"] == [DIR_A.upper()]
    assert settings.allows(DIR_A)
    assert settings.allows(P1)
    assert not settings.allows(P2)
    assert settings.is_directory(DIR_A)
    assert not settings.is_directory(P1)
    with pytest.raises(SettingsError, match=r'directories: "zz" is not a 64-hex uid'):
        Settings(directories=("zz",)).validate()
    with pytest.raises(SettingsError, match="at most 32"):
        Settings(directories=tuple(huid(str(i)) for i in range(33))).validate()
    assert parse_pairs([f"directories={DIR_A}, {DIR_B}"]) == {"directories": [DIR_A, DIR_B]}


# -- find ----------------------------------------------------------------------------------


async def test_find_merges_the_hits_of_two_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w:
            found = await w.find("fortune")
            assert _claims(found) == {(P1, "fortune"): [DIR_A, DIR_B], (P2, "fortune"): [DIR_B]}
            assert [(d["directory"], d["outcome"], d["hits"]) for d in found["directories"]] == [
                (DIR_A, "ok", 1),
                (DIR_B, "ok", 2),
            ]
            claim = found["hits"][0]["claims"][0]
            assert claim["priceAtoms"] == 500
            assert claim["lastVerifiedExecution"] == START
            assert found["now"] == BRIDGE_NOW
            assert w.payer.calls == []  # search is free here

            assert await w.cli("find", "fortune", "--tag", "fun") == 0
            out, err = capsys.readouterr()
            assert f"{P1}  fortune  500 atoms  [fun, fortune]" in out
            assert f"said by directory {DIR_A}: 500 atoms, verified 1h ago, catalog checked 1h ago" in out
            assert f"said by directory {DIR_B}" in out
            assert P2 in out
            assert "2 tool(s)" in out
            assert err == ""
            # The setting never widened allowed_bots: providers stay unreachable.
            assert w.bridge.settings.allowed_bots == ()
            assert not w.bridge.settings.allows(P1)


async def test_find_errors_name_the_command_that_fixes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path, settings=bridge_settings(directories=None)) as w:
            assert await w.cli("find", "fortune") == 1
            _, err = capsys.readouterr()
            assert "no directories configured; add one with: brmcp-bridge --datadir" in err
            assert "settings set directories=<directory uid>" in err
            async with w.admin_http() as http:
                response = await http.post("/admin/find", json={"query": "x"})
                assert response.status_code == 409
                bad = await http.post("/admin/find", json={"query": "x", "maxPrice": 3})
                assert bad.status_code == 400
                assert "unknown key 'maxPrice'" in bad.json()["error"]
                bad = await http.post("/admin/find", json={"tags": ["x" * 33]})
                assert "tags must be at most 16 strings of 1 to 32 characters" in bad.json()["error"]
    # No daemon at all (the record the commands found is gone with it).
    remove_runtime(tmp_path / "bridge")
    assert cli.main(["--datadir", str(tmp_path / "bridge"), "find", "fortune"]) == 1
    _, err = capsys.readouterr()
    assert "find needs the running daemon, and it is not running" in err


async def test_unreachable_directory_is_said_and_the_other_still_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path, contacts={DIR_A}) as w:
            found = await w.find("fortune")
            assert _claims(found) == {(P1, "fortune"): [DIR_A]}
            answer = found["directories"][1]
            assert answer["outcome"] == "unreachable"
            assert (
                f"directory {DIR_B} is not a contact of your brclient (no key exchange yet)"
                in answer["error"]
            )
            assert await w.cli("find", "fortune") == 0
            _, err = capsys.readouterr()
            assert "is not a contact of your brclient" in err


async def test_priced_search_above_the_cap_is_refused_naming_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path, search_price=300, settings=bridge_settings(per_call_cap_atoms=100)) as w:
            found = await w.find("fortune")
            assert found["hits"] == []
            for answer in found["directories"]:
                assert answer["outcome"] == "refused"
                assert "300 atoms exceeds the per-call cap (100)" in answer["error"]
                assert "settings set per_call_cap_atoms=N" in answer["error"]
            assert w.payer.calls == []
            assert await w.cli("find", "fortune") == 1
            _, err = capsys.readouterr()
            assert "exceeds the per-call cap (100)" in err
            assert "no directory answered the search" in err


async def test_priced_search_pays_within_caps_in_autopay(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path, search_price=300) as w:
            found = await w.find("fortune")
            assert _claims(found) == {(P1, "fortune"): [DIR_A, DIR_B], (P2, "fortune"): [DIR_B]}
            assert sorted(w.payer.calls) == sorted([(DIR_A, 300), (DIR_B, 300)])
            assert w.bridge.spend_log().day_total_atoms == 600


async def test_priced_search_in_approval_mode_parks_until_the_user_decides(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        # A clock that stands still: the parked payments wait for the decisions.
        clock = ManualClock(BRIDGE_NOW)
        async with world(
            tmp_path, search_price=300, settings=bridge_settings(mode="approval"), clock=clock
        ) as w:
            results: list[dict[str, Any]] = []

            async def run() -> None:
                results.append(await w.find("fortune"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await until(lambda: len(w.bridge.pending_payments()) == 2)
                pending = {p.bot: p for p in w.bridge.pending_payments()}
                assert {p.tool for p in pending.values()} == {"search"}
                assert {p.atoms for p in pending.values()} == {300}
                assert w.payer.calls == []
                assert w.bridge.resolve_payment(pending[DIR_A].id, True)
                assert w.bridge.resolve_payment(pending[DIR_B].id, False)
            (found,) = results
            assert w.payer.calls == [(DIR_A, 300)]
            assert _claims(found) == {(P1, "fortune"): [DIR_A]}
            denied = found["directories"][1]
            assert denied["outcome"] == "refused"
            assert "payment denied by the user" in denied["error"]


# -- agents --------------------------------------------------------------------------------


async def test_agents_reach_directories_but_not_settings(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx2.AsyncClient(base_url=w.base_url, headers=headers, timeout=30) as http:
                widen = await http.put("/admin/settings", json={"allowed_bots": [P1]})
                assert widen.status_code == 401
                add = await http.post("/admin/introduce", json={"uid": P1})
                assert add.status_code == 401
            from mcp.client.streamable_http import streamable_http_client

            async with (
                httpx2.AsyncClient(headers=headers, timeout=30) as http,
                streamable_http_client(f"{w.base_url}/mcp/{DIR_A}", http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                names = {t.name for t in (await session.list_tools()).tools}
                assert {"search", "introduce", "get_provider"} <= names
                result = await session.call_tool("search", {"query": "fortune"})
                assert result.structured_content is not None
                assert result.structured_content["total"] == 1
            async with (
                httpx2.AsyncClient(headers=headers, timeout=30) as http,
            ):
                denied = await http.post(
                    f"{w.base_url}/mcp/{P1}", json={}, headers={"Content-Type": "application/json"}
                )
                assert denied.status_code == 404
            assert w.bridge.settings.allowed_bots == ()


# -- add -----------------------------------------------------------------------------------


async def test_add_a_contact_allows_it_sets_the_caps_and_prints_the_snippet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path, contacts={DIR_A, DIR_B, P1}) as w:
            assert await w.cli("add", P1, "--per-call-cap", "2000", "--per-day-cap", "5000") == 0
            out, err = capsys.readouterr()
            assert w.suggester.sent == []  # a contact needs no introduction
            settings = w.bridge.settings
            assert settings.allowed_bots == (P1,)
            assert (settings.per_call_cap_atoms, settings.per_day_cap_atoms) == (2000, 5000)
            assert f"/mcp/{P1}" in out
            assert f"claude mcp add --transport http brmcp-{P1[:8]}" in out
            assert "per_call_cap_atoms=2000 per_day_cap_atoms=5000" in err
            # Twice: nothing more to change.
            assert await w.cli("add", P1) == 0
            _, err = capsys.readouterr()
            assert "is already allowed" in err
            assert w.bridge.settings.allowed_bots == (P1,)


async def test_add_without_kx_introduces_through_the_directory_that_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w:
            # P2 is listed only at DIR_B: DIR_A refuses to introduce it.
            assert await w.cli("add", P2) == 0
            out, err = capsys.readouterr()
            assert w.suggester.sent == [(CLIENT, P2)]
            assert f"directory {DIR_B} sent your brclient a KX suggestion toward {P2}" in err
            assert "accept the KX suggestion: in brclient type the /mi command it shows" in err
            # What brclient shows names the directory by nick; the uid form works too.
            assert f"(/mi <the directory's nick> {P2}), or: /mi {DIR_B} {P2};" in err
            assert f"key exchange with {P2} completed" in err
            assert w.bridge.settings.allowed_bots == (P2,)
            assert f"/mcp/{P2}" in out


async def test_add_waits_for_the_kx_and_gives_up_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w:
            w.suggester.accept = False
            assert await w.cli("add", P1, "--via", DIR_A, "--kx-timeout", "1") == 1
            _, err = capsys.readouterr()
            assert w.suggester.sent == [(CLIENT, P1)]
            assert f"no key exchange with {P1} within 1 s: accept the KX suggestion in brclient" in err
            assert w.bridge.settings.allowed_bots == ()
            # Bad input, each one line.
            assert await w.cli("add", "zz") == 1
            assert "provider uid 'zz' is not 64 hex characters" in capsys.readouterr().err
            assert await w.cli("add", P1, "--via", STRANGER) == 1
            _, err = capsys.readouterr()
            assert f"via: {STRANGER} is not on directories" in err
            assert "settings set directories=<the uids now>," in err
            assert await w.cli("add", STRANGER) == 1
            _, err = capsys.readouterr()
            assert f"no directory introduced you to {STRANGER}" in err
            assert "no listing for that uid" in err
            assert w.bridge.settings.allowed_bots == ()


# -- the KX source over clientrpc ------------------------------------------------------------


async def test_clientrpc_contacts_on_the_fake_brclient(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with FakeRelay() as relay, FakeBRClient(relay, "me", tmp_path / "me") as me:
            provider = relay.add_user("provider")
            other = relay.add_user("other")
            async with me.client(**FAST_RPC) as client:
                await client.wait_connected()
                contacts = ClientrpcContacts(client)
                assert await contacts.is_contact(provider) is False
                assert await contacts.wait_kx(provider, 0.2) is False
                relay.kx(me, other)
                assert await contacts.is_contact(other) is True
                assert await contacts.wait_kx(other, 5) is True
                done: list[bool] = []

                async def wait() -> None:
                    done.append(await contacts.wait_kx(provider, 20))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    relay.complete_kx(me, provider)
                assert done == [True]


# -- hostile directories ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer(Behaviour):
    """Answers every call with ``structured`` (as JSON text too), or never
    when None."""

    structured: dict[str, Any] | None

    def respond(self, bot: HostileBot, call: HostileCall, state: KeyState) -> Reply:
        if self.structured is None:
            return Reply(None)
        text = types.TextContent(type="text", text=json.dumps(self.structured))
        return Reply(types.CallToolResult(content=[text], structured_content=self.structured))


def hostile_dir(fabric_holder: list[Fabric], behaviour: Behaviour, price: int = 0) -> HostileBot:
    return HostileBot(
        fabric_holder[0],
        HOSTILE,
        [HostileTool("search", price_atoms=price), HostileTool("introduce")],
        strategy=by_tool({"search": behaviour, "introduce": Answer({"suggested": True, "note": "trust me"})}),
    )


@asynccontextmanager
async def hostile_world(
    tmp_path: Path, behaviour: Behaviour, price: int = 0, **settings: Any
) -> AsyncIterator[World]:
    """The world with a hostile directory at HOSTILE next to DIR_A."""
    async with world(tmp_path, settings=bridge_settings(directories=(DIR_A, HOSTILE), **settings)) as w:
        bot = hostile_dir([w.fabric], behaviour, price)
        await w.stack.enter_async_context(bot)
        w.payer.hostile[HOSTILE] = bot
        yield w


async def test_hostile_directory_that_lies_and_floods_is_bounded(tmp_path: Path) -> None:
    lies = [
        {
            "providerUid": huid(f"lie {i}"),
            "tool": f"free\x1b[2Jmoney{i}",
            "description": "\u202eevil" + "x" * 400,
            "priceAtoms": -5 if i % 2 else 0,
            "lastVerifiedExecution": "yesterday",
            "tags": ["t"] * 40,
        }
        for i in range(1000)
    ]
    lies[:0] = [
        {"providerUid": "not-a-uid", "tool": "x"},
        {"providerUid": P1, "tool": "fortune", "priceAtoms": 0},
    ]
    with anyio.fail_after(60):
        async with hostile_world(tmp_path, Answer({"hits": lies, "total": 10**30})) as w:
            found = await w.find("fortune")
            answer = found["directories"][1]
            assert answer["outcome"] == "ok"
            assert answer["hits"] == 50
            assert answer["dropped"] == len(lies) - 50
            assert answer["total"] == 10**30
            mine = [c for h in found["hits"] for c in h["claims"] if c["directory"] == HOSTILE]
            assert len(mine) == 50
            # Its lie about P1 is shown as its claim, next to the honest one.
            assert _claims(found)[(P1, "fortune")] == [DIR_A, HOSTILE]
            for claim in mine:
                assert claim["description"].isprintable()
                assert len(claim["description"]) <= 300
                assert claim["lastVerifiedExecution"] is None
                assert claim["priceAtoms"] in (0, None)
                assert len(claim["tags"]) <= 16
            tools = [h["tool"] for h in found["hits"]]
            assert all(t.isprintable() for t in tools)
            # Nothing it said reached the settings or the wallet.
            assert w.bridge.settings.allowed_bots == ()
            assert w.payer.calls == []


async def test_hostile_directory_with_a_huge_answer_is_refused(tmp_path: Path) -> None:
    huge = {"hits": [{"providerUid": P2, "tool": "big", "description": "y" * (1_100_000)}], "total": 1}
    with anyio.fail_after(120):
        async with hostile_world(tmp_path, Answer(huge)) as w:
            found = await w.find("fortune")
            answer = found["directories"][1]
            assert answer["outcome"] == "failed"
            assert "answer over 1048576 bytes" in answer["error"]
            assert _claims(found) == {(P1, "fortune"): [DIR_A]}


async def test_hostile_directory_that_never_answers_is_cut_off_within_its_listing(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with hostile_world(tmp_path, Answer(None), price=10) as w:
            w.bridge.discovery.find_timeout = 0.5
            found = await w.find("fortune")
            answer = found["directories"][1]
            assert answer["outcome"] == "timeout"
            assert (
                f"directory {HOSTILE} did not answer search within 0 s; the call was cancelled"
                in answer["error"]
            )
            assert _claims(found) == {(P1, "fortune"): [DIR_A]}
            assert w.payer.paid_to(HOSTILE) <= 10


async def test_hostile_directory_cannot_make_the_bridge_pay_beyond_the_listing_or_caps(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with hostile_world(tmp_path, PriceSwitch(ask_atoms=9_000), price=10) as w:
            found = await w.find("fortune")
            answer = found["directories"][1]
            assert answer["outcome"] == "refused"
            assert "listed at 10 atoms" in answer["error"]
            # At most the listed price (paid alongside the first call), never its ask.
            assert w.payer.paid_to(HOSTILE) <= 10
        async with hostile_world(tmp_path / "loop", RefusalLoop(), price=10) as w:
            found = await w.find("fortune")
            answer = found["directories"][1]
            assert answer["outcome"] == "refused"
            assert w.payer.paid_to(HOSTILE) == 10  # one payment, within the listing
            # Its introduce lies: it says it suggested, no KX ever completes.
            w.suggester.accept = False
            assert await w.cli("add", P2, "--via", HOSTILE, "--kx-timeout", "1") == 1
            assert w.bridge.settings.allowed_bots == ()
            assert w.bridge.spend_log().day_total_atoms == 10
