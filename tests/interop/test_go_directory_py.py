"""Our directory pieces against the Go reference's directory on the fabric
(``brmcp-goref directory|provider``, tests/interop/godir.py).

* Our provider (a :class:`~brmcp.server.Harness` with the priced ``test``
  tool and our :class:`~brmcp.directory.provider._registrant.Registrant` under an
  :class:`~brmcp.directory.provider._registrant.AutoFund` policy) registers at the
  reference's directory, funds the listing, is crawled and test-called,
  approved and listed; a second ``register`` pays nothing.
* A second reference directory federates with the first, finds our
  provider as a lead and invites it through our ``listing_invite``; our
  Registrant accepts within its policy and registers there, or declines a
  directory its policy does not allow (the reason lands on the lead).
* A second ``register`` while the registration waits for review pays
  nothing: the reference's directory would replace the verified
  application and invoice the fee again, so our Registrant leaves an
  application under way or awaiting review alone.
* Where our :class:`~brmcp.directory.Directory` is installed: the
  reference's provider registers at ours and is listed after an admin
  approval, and ours and the reference's federate both ways (each buys the
  other's signed snapshot, turns its listings into leads and invites them);
  one provider's way through each directory gives the same answers and the
  same money, refusals worded alike.

Every payment either side launches goes through a payer of the test that
credits the payee's ledger, so the books are checked to the atom on every
ledger involved: what a provider paid is the directory's fee plus the
escrow left plus the test charges the directory paid on, and every test
payment a provider received was charged for exactly one test call.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp import ManualClock
from brmcp.directory.tools import EXTENSION_KEYS, EXTENSION_TOOLS
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid
from brmcp.transport import Router
from tests.kit import until

from .godir import (
    ADMIN,
    DIRECTORY,
    PEER_DIRECTORY,
    PROVIDER,
    GoDirectory,
    add_probe_tools,
    go_autofund_provider,
    go_directory,
    go_directory_pair,
    go_provider,
)
from .test_go_directory import ok, session, status, wait_state

registrant = pytest.importorskip(
    "brmcp.directory.provider._registrant", reason="brmcp.directory (the Python Registrant) is not importable"
)
dtypes = pytest.importorskip(
    "brmcp.directory.model._types", reason="brmcp.directory.model._types is not importable"
)

pytestmark = pytest.mark.interop

START = 1_800_000_000
DAY = 86_400
FEE = 50_000
TEST_PRICE = 5_000
TEST_MAX = 20_000
COST = FEE + TEST_MAX
#: The reference's default snapshot price (the policies here leave it unset).
SNAPSHOT_PRICE = 10_000
EXPIRES = START + 30 * DAY
POLICY = {"admin_uids": [ADMIN], "listing_fee_atoms": FEE, "name": "interop-dir"}
NOW = ["-now", str(START)]
#: A second provider, listed at our directory only (the federation test).
PROVIDER2 = uid(0xF)


@dataclass
class FundPayer:
    """Our Registrant's payer: a payment is a tip landing at the directory
    (the reference's ``CreditTip`` through ``credit_tip``); records every
    settled payment as (directory uid, atoms)."""

    directories: dict[str, GoDirectory] = field(default_factory=dict)
    payments: list[tuple[str, int]] = field(default_factory=list)

    async def pay(self, payee_uid: str, atoms: int) -> None:
        await self.directories[payee_uid].credit_tip(PROVIDER, atoms)
        self.payments.append((payee_uid, atoms))


@dataclass
class PyProvider:
    """Our provider at :data:`PROVIDER`: the harness, its router, the
    Registrant, the runs of the ``test`` tool (its arguments) and the
    Registrant's outcomes (directory uid, status JSON or None, error text)."""

    harness: Harness
    router: Router
    registrant: Any
    payer: FundPayer
    data_dir: Path
    runs: list[dict[str, Any]]
    notices: list[tuple[str, dict[str, Any] | None, str]]

    def history(self) -> list[dict[str, Any]]:
        """The fund history file (``regfund.json``), [] before it exists."""
        path = self.data_dir / registrant.FUND_FILE
        return json.loads(path.read_text()) if path.exists() else []

    async def charged(self, payer_uid: str) -> tuple[int, int]:
        """(atoms credited, atoms charged) in ``payer_uid``'s statement."""
        entries = await self.harness.statement(payer_uid)
        credited = sum(e.atoms for e in entries if e.atoms > 0)
        charged = -sum(e.atoms for e in entries if e.kind == "charge")
        return credited, charged


@asynccontextmanager
async def py_provider(
    fabric: Fabric, data_dir: Path, directories: tuple[str, ...], *, funded: tuple[str, ...] | None = None
) -> AsyncIterator[PyProvider]:
    """Our provider at :data:`PROVIDER`, callable by ``directories``, its
    Registrant running (``listing_invite`` served) with AutoFund enabled:
    one registration per request, two per 30 days, only the ``funded``
    directories (default: ``directories``). Its clock stands at
    :data:`START`, as the reference's (``-now``)."""
    runs: list[dict[str, Any]] = []
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir / "bot",
            allowed_peers=set(directories),
            calls_per_minute=100_000,
            name="py-provider",
        )
    )

    add_probe_tools(harness, runs, price_atoms=TEST_PRICE)
    config = registrant.RegistrantConfig(
        description="A Python provider",
        tags=("Python", "interop"),
        test=dtypes.TestSpec(tool="test", args={"text": "probe"}, max_atoms=TEST_MAX),
        auto_fund=registrant.AutoFund(
            enabled=True,
            max_atoms_per_request=COST,
            max_atoms_per_month=2 * COST,
            allowed_directory_uids=directories if funded is None else funded,
        ),
    )
    notices: list[tuple[str, dict[str, Any] | None, str]] = []

    def notify(directory: str, st: Any, error: Exception | None) -> None:
        notices.append((directory, None if st is None else st.to_json(), "" if error is None else str(error)))

    payer = FundPayer()
    reg = registrant.Registrant(
        config,
        payer=payer,
        data_dir=data_dir / "registrant",
        clock=ManualClock(START),
        notify=notify,
        name="py-registrant",
        call_timeout=60.0,
    )
    reg.register_tools(harness)
    async with harness.serve(fabric.sender(PROVIDER)) as router, anyio.create_task_group() as tg:
        fabric.attach(PROVIDER, router.handle_pm)
        await tg.start(reg.run, router)
        yield PyProvider(harness, router, reg, payer, data_dir / "registrant", runs, notices)
        tg.cancel_scope.cancel()


async def test_python_provider_lists_at_the_go_directory(tmp_path: Path, goref_binary: Path) -> None:
    prov: list[PyProvider] = []

    async def directory_pays(payee: str, atoms: int) -> None:
        # The directory's test payment lands in our provider's ledger.
        assert payee == PROVIDER
        await prov[0].harness.credit(DIRECTORY, atoms)

    async with (
        Fabric() as fabric,
        go_directory(fabric, goref_binary, tmp_path / "dir", POLICY, pay=directory_pays, args=NOW) as d,
        py_provider(fabric, tmp_path / "prov", (DIRECTORY,)) as p,
        fabric.router(ADMIN) as admin_router,
        session(admin_router, DIRECTORY) as admin,
    ):
        prov.append(p)
        p.payer.directories[DIRECTORY] = d
        first = await p.registrant.register(DIRECTORY)
        # Paid once, the shortfall of the invoice: the fee plus our test budget.
        assert p.payer.payments == [(DIRECTORY, COST)]
        assert p.history() == [{"ts": START, "directoryUid": DIRECTORY, "atoms": COST}]
        assert first.state in {"crawling", "testing", "pending_review"}
        assert (first.fee_atoms, first.test_budget_atoms) == (FEE, TEST_MAX)

        entry = await wait_state(d, PROVIDER, "pending_review")
        reg = entry["reg"]
        assert reg["testOutcome"] == "ok"
        assert reg["paidAtoms"] == TEST_PRICE
        assert reg["description"] == "A Python provider"
        assert reg["tags"] == ["python", "interop"]
        assert reg["test"] == {"tool": "test", "args": {"text": "probe"}, "maxAtoms": TEST_MAX}
        # The reference crawls our catalog: the Registrant's free tool included.
        catalog = {t["name"]: t for t in reg["catalog"]}
        assert set(catalog) == {"test", "echo", "listing_invite"}
        assert catalog["test"]["_meta"] == {"brmcp/priceAtoms": TEST_PRICE}
        assert catalog["listing_invite"]["_meta"] == {"brmcp/priceAtoms": 0}
        assert p.runs == [{"text": "probe"}]
        assert d.payments == [(PROVIDER, TEST_PRICE)]

        assert ok(await admin.call_tool("approve", {"uid": PROVIDER})) == {
            "state": "listed",
            "expiresAt": EXPIRES,
        }
        async with session(p.router, DIRECTORY) as mine:
            assert await status(mine) == {"state": "listed", "expiresAt": EXPIRES}
        hits = ok(await admin.call_tool("search", {"tags": ["python"]}))
        assert sorted(h["tool"] for h in hits["hits"]) == ["echo", "listing_invite", "test"]

        # Listed and far from expiry: the second register reads my_status and pays nothing.
        again = await p.registrant.register(DIRECTORY)
        assert again.to_json() == {"state": "listed", "expiresAt": EXPIRES}
        assert p.payer.payments == [(DIRECTORY, COST)]
        assert len(p.history()) == 1
        assert [(who, error) for who, _, error in p.notices] == [(DIRECTORY, ""), (DIRECTORY, "")]
        assert p.notices[-1][1] == {"state": "listed", "expiresAt": EXPIRES}
        assert [e["action"] for e in (await d.state())["adminlog"]] == ["approve"]

        # The books, to the atom. Ours paid the directory the fee and the
        # escrow; the directory kept the fee, paid our test out of the
        # escrow and holds the rest; our ledger charged what it was paid.
        paid = sum(atoms for _, atoms in p.payer.payments)
        escrow = await d.balance(PROVIDER)
        assert escrow == TEST_MAX - TEST_PRICE
        assert paid == FEE + escrow + sum(atoms for _, atoms in d.payments)
        assert sum(e["atoms"] for e in p.history()) == paid
        assert p.registrant.paid_atoms == paid
        assert await p.charged(DIRECTORY) == (TEST_PRICE, TEST_PRICE)
        assert await p.harness.balance(DIRECTORY) == 0
        assert d.failed_payments == []
        spend = (await d.state())["spend"]
        assert [(s["uid"], s["tool"], s["atoms"]) for s in spend] == [(PROVIDER, "test", TEST_PRICE)]


@pytest.mark.parametrize("accepted", [True, False], ids=["accepted", "declined"])
async def test_go_directory_invites_the_python_registrant(
    tmp_path: Path, goref_binary: Path, accepted: bool
) -> None:
    """A second reference directory buys the first's snapshot, finds our
    provider there as a lead and pursues it: its ``listing_invite`` reaches
    our Registrant, which accepts within AutoFund and registers back; or,
    when the second directory is not among ``allowed_directory_uids``,
    declines, and the reference keeps the reason on the lead."""
    prov: list[PyProvider] = []
    dirs: dict[str, GoDirectory] = {}

    async def first_pays(payee: str, atoms: int) -> None:
        assert payee == PROVIDER
        await prov[0].harness.credit(DIRECTORY, atoms)

    async def second_pays(payee: str, atoms: int) -> None:
        # The second directory pays our test and the first's snapshot.
        if payee == PROVIDER:
            await prov[0].harness.credit(PEER_DIRECTORY, atoms)
        else:
            assert payee == DIRECTORY
            await dirs[DIRECTORY].credit_tip(PEER_DIRECTORY, atoms)

    async with (
        Fabric() as fabric,
        go_directory_pair(
            fabric, goref_binary, tmp_path, POLICY, first_pays=first_pays, second_pays=second_pays, args=NOW
        ) as (first, second),
        py_provider(
            fabric,
            tmp_path / "prov",
            (DIRECTORY, PEER_DIRECTORY),
            funded=None if accepted else (DIRECTORY,),
        ) as p,
        fabric.router(ADMIN) as admin_router,
        session(admin_router, DIRECTORY) as admin_first,
        session(admin_router, PEER_DIRECTORY) as admin_second,
    ):
        prov.append(p)
        dirs.update({DIRECTORY: first, PEER_DIRECTORY: second})
        p.payer.directories.update(dirs)
        await p.registrant.register(DIRECTORY)
        await wait_state(first, PROVIDER, "pending_review")
        ok(await admin_first.call_tool("approve", {"uid": PROVIDER}))

        assert ok(await admin_second.call_tool("add_peer", {"uid": DIRECTORY, "pubKey": first.pub_key})) == {
            "added": True
        }
        assert ok(await admin_second.call_tool("verify_peer", {"uid": DIRECTORY})) == {"newLeads": 1}
        lead = {
            "providerUid": PROVIDER,
            "peerUid": DIRECTORY,
            "description": "A Python provider",
            "tags": ["python", "interop"],
            "state": "new",
            "createdAt": START,
            "updatedAt": START,
        }
        assert ok(await admin_second.call_tool("leads", {})) == {"leads": [lead]}

        if not accepted:
            # The reference counts a declined invite as delivered: the lead
            # is "invited", the Registrant's reason in its note.
            pursued = ok(await admin_second.call_tool("pursue_lead", {"uid": PROVIDER}))
            reason = "directory not in allowed_directory_uids"
            assert pursued == {**lead, "state": "invited", "note": f"declined: {reason}"}
            assert p.notices[-1] == (
                PEER_DIRECTORY,
                {"state": "none", "note": f"invite declined: {reason}"},
                "",
            )
            assert ((await second.state())["index"] or {}).get(PROVIDER) is None
            assert p.payer.payments == [(DIRECTORY, COST)]
            assert second.payments == [(DIRECTORY, SNAPSHOT_PRICE)]
            assert await p.harness.balance(PEER_DIRECTORY) == 0
            assert await second.balance(PROVIDER) == 0
            return

        # The invite names the second directory's fee; ours accepts (the
        # caller's uid is allowed, fee plus test budget within the caps)
        # and registers in the background.
        pursued = ok(await admin_second.call_tool("pursue_lead", {"uid": PROVIDER}))
        assert pursued["providerUid"] == PROVIDER
        assert pursued["state"] in {"invited", "converted"}
        assert "note" not in pursued
        entry = await wait_state(second, PROVIDER, "pending_review")
        assert entry["reg"]["testOutcome"] == "ok"
        await until(lambda: len(p.notices) == 2)
        assert [(who, error) for who, _, error in p.notices] == [(DIRECTORY, ""), (PEER_DIRECTORY, "")]
        assert ok(await admin_second.call_tool("leads", {})) == {"leads": [{**lead, "state": "converted"}]}
        assert first.introductions == second.introductions == []

        # The books: ours paid each directory once; each kept its fee and
        # holds the escrow left after the one test it paid for; the second
        # also bought one snapshot from the first.
        assert p.payer.payments == [(DIRECTORY, COST), (PEER_DIRECTORY, COST)]
        assert p.history() == [
            {"ts": START, "directoryUid": DIRECTORY, "atoms": COST},
            {"ts": START, "directoryUid": PEER_DIRECTORY, "atoms": COST},
        ]
        assert first.payments == [(PROVIDER, TEST_PRICE)]
        assert second.payments == [(DIRECTORY, SNAPSHOT_PRICE), (PROVIDER, TEST_PRICE)]
        for d in (first, second):
            assert await d.balance(PROVIDER) == TEST_MAX - TEST_PRICE
            assert await p.charged(d.uid) == (TEST_PRICE, TEST_PRICE)
            assert await p.harness.balance(d.uid) == 0
        assert await first.balance(PEER_DIRECTORY) == 0
        assert p.runs == [{"text": "probe"}] * 2
        assert first.failed_payments == second.failed_payments == []


async def test_a_restart_during_review_pays_nothing(tmp_path: Path, goref_binary: Path) -> None:
    """Our provider registered and passed its test; the operator has not
    reviewed it yet. A second ``register`` (a host restart) must not pay."""
    prov: list[PyProvider] = []

    async def directory_pays(payee: str, atoms: int) -> None:
        await prov[0].harness.credit(DIRECTORY, atoms)

    async with (
        Fabric() as fabric,
        go_directory(fabric, goref_binary, tmp_path / "dir", POLICY, pay=directory_pays, args=NOW) as d,
        py_provider(fabric, tmp_path / "prov", (DIRECTORY,)) as p,
    ):
        prov.append(p)
        p.payer.directories[DIRECTORY] = d
        await p.registrant.register(DIRECTORY)
        await wait_state(d, PROVIDER, "pending_review")
        await p.registrant.register(DIRECTORY)
        assert p.payer.payments == [(DIRECTORY, COST)]
        assert (await wait_state(d, PROVIDER, "pending_review"))["reg"]["testOutcome"] == "ok"


# -- the reference's pieces at our directory -----------------------------------------------


@dataclass
class Routes:
    """A payer that sends each payment to the payee's credit function (a
    tip landing in the payee's ledger); records every settled payment as
    (payee uid, atoms). Our Directory's payer and the Go peers' ``pay``
    callbacks both go through one of these."""

    credit: dict[str, Any] = field(default_factory=dict)
    payments: list[tuple[str, int]] = field(default_factory=list)

    async def pay(self, payee_uid: str, atoms: int) -> None:
        await self.credit[payee_uid](atoms)
        self.payments.append((payee_uid, atoms))


@dataclass
class PyDirectory:
    """Our :class:`~brmcp.directory.Directory` at :attr:`uid`, paid through
    :attr:`payer`; :meth:`credit_tip` reports a tip in atoms as brclient
    would (milliatoms, a fresh sequence id)."""

    directory: Any
    uid: str
    payer: Routes
    seq: int = 0

    async def credit_tip(self, from_uid: str, atoms: int) -> None:
        self.seq += 1
        assert await self.directory.credit_tip(from_uid, atoms * 1000, self.seq) == atoms

    async def balance(self, of: str) -> int:
        return int(await self.directory.harness.balance(of))

    async def state_of(self, of: str) -> str:
        return str((await self.directory.pipeline.status(of)).state)

    async def wait_state(self, of: str, state: str) -> None:
        async def reached() -> bool:
            return await self.state_of(of) == state

        await until(reached, limit=60)


def python_directory() -> Any:
    """``brmcp.directory._service``, or a skip naming why it is missing."""
    return pytest.importorskip(
        "brmcp.directory._service", reason="brmcp.directory._service (the Python Directory) is not importable"
    )


@asynccontextmanager
async def py_directory(fabric: Fabric, data_dir: Path, *, at: str = DIRECTORY) -> AsyncIterator[PyDirectory]:
    """Our directory at ``at`` with :data:`POLICY`'s terms, on a clock
    standing at :data:`START` (the reference's ``-now``); it sends nothing
    of its own (no sweep)."""
    service = python_directory()
    from brmcp.directory import Policy, Timeouts

    policy = Policy(admin_uids=(ADMIN,), listing_fee_atoms=FEE, name="py-dir", calls_per_minute=100_000)
    payer = Routes()
    config = service.DirectoryConfig(
        data_dir,
        policy,
        payer,
        self_uid=at,
        clock=ManualClock(START),
        timeouts=Timeouts(dial=30.0, crawl=30.0, call=30.0, pay=30.0),
        sweep_interval=0,
    )
    async with AsyncExitStack() as stack:
        directory = await stack.enter_async_context(service.Directory(config))
        router = await directory.start(fabric.sender(at))
        fabric.attach(at, router.handle_pm)
        yield PyDirectory(directory, at, payer)


async def test_go_provider_lists_at_the_python_directory(tmp_path: Path, goref_binary: Path) -> None:
    """The reference's Registrant registers at our directory under its
    AutoFund policy; ours crawls it, pays for its test call, parks it for
    review; our admin tool approves it and the reference reads it listed."""
    python_directory()
    holder: dict[str, Any] = {}

    async def provider_pays(payee: str, atoms: int) -> None:
        assert payee == DIRECTORY
        await holder["dir"].credit_tip(PROVIDER, atoms)

    async with (
        Fabric() as fabric,
        py_directory(fabric, tmp_path / "dir") as d,
        go_autofund_provider(
            fabric,
            goref_binary,
            tmp_path / "prov",
            [DIRECTORY],
            price=TEST_PRICE,
            test_max=TEST_MAX,
            max_per_request=COST,
            pay=provider_pays,
            args=NOW,
        ) as prov,
        fabric.router(ADMIN) as admin_router,
        session(admin_router, DIRECTORY) as admin,
    ):
        holder["dir"] = d
        d.payer.credit[PROVIDER] = lambda atoms: prov.credit(DIRECTORY, atoms)
        assert await prov.register(DIRECTORY) == ""
        assert prov.payments == [(DIRECTORY, COST)]
        ((who, last, error),) = prov.notices
        assert (who, error) == (DIRECTORY, "")
        assert last["state"] in {"crawling", "testing", "pending_review"}
        assert (last["feeAtoms"], last["testBudgetAtoms"]) == (FEE, TEST_MAX)

        await d.wait_state(PROVIDER, "pending_review")
        assert d.payer.payments == [(PROVIDER, TEST_PRICE)]
        assert prov.executions("test") == 1
        queue = ok(await admin.call_tool("pending_registrations", {}))
        [pending] = queue["registrations"]
        assert {
            k: pending[k] for k in ("uid", "state", "description", "tags", "testOutcome", "paidAtoms")
        } == {
            "uid": PROVIDER,
            "state": "pending_review",
            "description": "interop provider",
            "tags": ["go"],
            "testOutcome": "ok",
            "paidAtoms": TEST_PRICE,
        }
        assert ok(await admin.call_tool("approve", {"uid": PROVIDER})) == {
            "state": "listed",
            "expiresAt": EXPIRES,
        }
        hits = ok(await admin.call_tool("search", {"tags": ["go"], "maxPriceAtoms": TEST_PRICE}))
        assert sorted((h["tool"], h.get("priceAtoms")) for h in hits["hits"]) == [
            ("echo", None),
            ("listing_invite", None),
            ("test", TEST_PRICE),
        ]

        # The reference's second Register reads the listing and pays nothing.
        assert await prov.register(DIRECTORY) == ""
        assert prov.payments == [(DIRECTORY, COST)]
        assert prov.notices[-1] == (DIRECTORY, {"state": "listed", "expiresAt": EXPIRES}, "")

        # The books: the provider paid the fee and the escrow; our directory
        # paid one test out of the escrow and the provider charged it.
        escrow = await d.balance(PROVIDER)
        assert escrow == TEST_MAX - TEST_PRICE
        assert sum(a for _, a in prov.payments) == FEE + escrow + sum(a for _, a in d.payer.payments)
        assert await prov.balance(DIRECTORY) == 0
        assert prov.failed_payments == []


async def test_python_and_go_directories_federate(tmp_path: Path, goref_binary: Path) -> None:
    """Ours (at DIRECTORY) and the reference's (at PEER_DIRECTORY) trust
    each other's snapshot key. Each lists one reference provider (PROVIDER
    at the Go directory, PROVIDER2 at ours); each buys the other's signed
    snapshot out of pocket, finds the other's provider as a lead and
    invites it; the provider's Registrant registers there."""
    python_directory()
    go_routes, prov_routes, prov2_routes = Routes(), Routes(), Routes()
    now = NOW

    def provider(at: str, data: str, routes: Routes) -> Any:
        return go_provider(
            fabric,
            goref_binary,
            at,
            tmp_path / data,
            allow=[DIRECTORY, PEER_DIRECTORY],
            price=TEST_PRICE,
            test_max=TEST_MAX,
            description=f"provider {data}",
            tags=[data],
            autofund=True,
            max_per_request=COST,
            max_per_month=2 * COST,
            allowed_directories=[DIRECTORY, PEER_DIRECTORY],
            pay=routes.pay,
            args=now,
        )

    async with Fabric() as fabric, AsyncExitStack() as stack:
        py = await stack.enter_async_context(py_directory(fabric, tmp_path / "py"))
        go = await stack.enter_async_context(
            go_directory(
                fabric,
                goref_binary,
                tmp_path / "go",
                {**POLICY, "name": "go-dir"},
                at=PEER_DIRECTORY,
                pay=go_routes.pay,
                args=now,
            )
        )
        prov = await stack.enter_async_context(provider(PROVIDER, "one", prov_routes))
        prov2 = await stack.enter_async_context(provider(PROVIDER2, "two", prov2_routes))
        admin_router = await stack.enter_async_context(fabric.router(ADMIN))
        admin_py = await stack.enter_async_context(session(admin_router, DIRECTORY))
        admin_go = await stack.enter_async_context(session(admin_router, PEER_DIRECTORY))

        # Every payment is a tip landing in the payee's ledger, from the payer.
        prov_routes.credit.update(
            {
                DIRECTORY: lambda a: py.credit_tip(PROVIDER, a),
                PEER_DIRECTORY: lambda a: go.credit_tip(PROVIDER, a),
            }
        )
        prov2_routes.credit.update(
            {
                DIRECTORY: lambda a: py.credit_tip(PROVIDER2, a),
                PEER_DIRECTORY: lambda a: go.credit_tip(PROVIDER2, a),
            }
        )
        py.payer.credit.update(
            {
                PROVIDER: lambda a: prov.credit(DIRECTORY, a),
                PROVIDER2: lambda a: prov2.credit(DIRECTORY, a),
                PEER_DIRECTORY: lambda a: go.credit_tip(DIRECTORY, a),
            }
        )
        go_routes.credit.update(
            {
                PROVIDER: lambda a: prov.credit(PEER_DIRECTORY, a),
                PROVIDER2: lambda a: prov2.credit(PEER_DIRECTORY, a),
                DIRECTORY: lambda a: py.credit_tip(PEER_DIRECTORY, a),
            }
        )

        # One listing at each directory.
        assert await prov.register(PEER_DIRECTORY) == ""
        await wait_state(go, PROVIDER, "pending_review")
        ok(await admin_go.call_tool("approve", {"uid": PROVIDER}))
        assert await prov2.register(DIRECTORY) == ""
        await py.wait_state(PROVIDER2, "pending_review")
        ok(await admin_py.call_tool("approve", {"uid": PROVIDER2}))

        # Ours buys the reference's snapshot, verifies it against the key
        # it was given and turns the unknown provider into a lead.
        assert ok(await admin_py.call_tool("add_peer", {"uid": PEER_DIRECTORY, "pubKey": go.pub_key})) == {
            "added": True
        }
        assert ok(await admin_py.call_tool("verify_peer", {"uid": PEER_DIRECTORY})) == {"newLeads": 1}
        assert py.payer.payments[-1] == (PEER_DIRECTORY, SNAPSHOT_PRICE)
        py_lead = {
            "providerUid": PROVIDER,
            "peerUid": PEER_DIRECTORY,
            "description": "provider one",
            "tags": ["one"],
            "state": "new",
            "createdAt": START,
            "updatedAt": START,
        }
        assert ok(await admin_py.call_tool("leads", {})) == {"leads": [py_lead]}

        # The reference buys ours and does the same.
        assert ok(
            await admin_go.call_tool("add_peer", {"uid": DIRECTORY, "pubKey": py.directory.public_key})
        ) == {"added": True}
        assert ok(await admin_go.call_tool("verify_peer", {"uid": DIRECTORY})) == {"newLeads": 1}
        assert go_routes.payments[-1] == (DIRECTORY, SNAPSHOT_PRICE)
        go_lead = {**py_lead, "providerUid": PROVIDER2, "peerUid": DIRECTORY, "description": "provider two"}
        go_lead["tags"] = ["two"]
        assert ok(await admin_go.call_tool("leads", {})) == {"leads": [go_lead]}
        # Verifying again finds nothing new (the snapshot is bought again).
        assert ok(await admin_py.call_tool("verify_peer", {"uid": PEER_DIRECTORY})) == {"newLeads": 0}

        # Each invites the other's provider; the reference's Registrant accepts.
        pursued = ok(await admin_py.call_tool("pursue_lead", {"uid": PROVIDER}))
        assert pursued["state"] in {"invited", "converted"}
        await py.wait_state(PROVIDER, "pending_review")
        pursued = ok(await admin_go.call_tool("pursue_lead", {"uid": PROVIDER2}))
        assert pursued["state"] in {"invited", "converted"}
        await wait_state(go, PROVIDER2, "pending_review")
        assert ok(await admin_py.call_tool("leads", {})) == {"leads": [{**py_lead, "state": "converted"}]}
        assert ok(await admin_go.call_tool("leads", {})) == {"leads": [{**go_lead, "state": "converted"}]}
        assert go.introductions == []

        # The books. Each provider paid each directory once; each directory
        # kept its fee and holds each provider's escrow less one test; the
        # snapshots were paid out of the directories' pockets and each
        # provider's ledger charged every test payment it received.
        assert prov_routes.payments == [(PEER_DIRECTORY, COST), (DIRECTORY, COST)]
        assert prov2_routes.payments == [(DIRECTORY, COST), (PEER_DIRECTORY, COST)]
        for who in (PROVIDER, PROVIDER2):
            assert await py.balance(who) == await go.balance(who) == TEST_MAX - TEST_PRICE
        for p in (prov, prov2):
            assert await p.balance(DIRECTORY) == await p.balance(PEER_DIRECTORY) == 0
            assert p.executions("test") == 2
        assert sorted(py.payer.payments) == sorted(
            [
                (PROVIDER2, TEST_PRICE),
                (PEER_DIRECTORY, SNAPSHOT_PRICE),
                (PEER_DIRECTORY, SNAPSHOT_PRICE),
                (PROVIDER, TEST_PRICE),
            ]
        )
        assert sorted(go_routes.payments) == sorted(
            [(PROVIDER, TEST_PRICE), (DIRECTORY, SNAPSHOT_PRICE), (PROVIDER2, TEST_PRICE)]
        )
        # What each directory sold the other is in the buyer's balance: spent at once.
        assert await py.balance(PEER_DIRECTORY) == 0
        assert await go.balance(DIRECTORY) == 0
        assert go.failed_payments == prov.failed_payments == prov2.failed_payments == []


# -- both directories, one script ----------------------------------------------------------

REGISTRATION = {
    "description": "An interop provider",
    "tags": ["Test", "interop", "test"],
    "test": {"tool": "test", "args": {"text": "probe"}, "maxAtoms": TEST_MAX},
}
#: Registrations the handler refuses (after the SDK's schema check passed).
REFUSED = [
    {**REGISTRATION, "test": {"tool": "test", "maxAtoms": 0}},
    {**REGISTRATION, "test": {"tool": "test", "maxAtoms": 10_000_001}},
    {**REGISTRATION, "description": "  "},
    {**REGISTRATION, "tags": ["x"] * 17},
]


async def answers(kind: str, tmp_path: Path, binary: Path) -> dict[str, Any]:
    """One provider's way through the directory of ``kind`` (``go`` or
    ``py``): every answer, keyed by step. A successful answer is its
    ``structuredContent`` (its text is checked to be the same JSON), a tool
    error ``{"error": text}``; the policy's ``name`` and ``pubKey`` and
    the snapshot's signature are left out (they differ by construction),
    the snapshot's payload is decoded; our extension keys
    (``EXTENSION_KEYS``, docs/directory.md §Reputation) are dropped from
    ``get_provider`` and search hits, as a Go client ignores them."""
    got: dict[str, Any] = {}

    def record(step: str, result: Any) -> None:
        text = "".join(getattr(block, "text", "") for block in result.content)
        if result.is_error:
            assert result.structured_content is None
            got[step] = {"error": text}
        else:
            assert json.loads(text) == result.structured_content
            answer = result.structured_content
            for item in [answer, *answer.get("hits", [])] if isinstance(answer, dict) else []:
                for key in EXTENSION_KEYS:
                    item.pop(key, None)
            got[step] = answer

    runs: list[dict[str, Any]] = []
    harness = Harness(
        HarnessConfig(data_dir=tmp_path / kind / "prov", allowed_peers={DIRECTORY}, calls_per_minute=100_000)
    )

    async def test_tool(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        runs.append(args)
        return {"ok": True}

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    harness.add_tool(
        "test", test_tool, description="A <priced> probe & more", input_schema=schema, price_atoms=TEST_PRICE
    )
    harness.add_tool("echo", test_tool, description="Echo.", input_schema={"type": "object"})

    async def pays(payee: str, atoms: int) -> None:
        assert payee == PROVIDER
        await harness.credit(DIRECTORY, atoms)

    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        router = await stack.enter_async_context(harness.serve(fabric.sender(PROVIDER)))
        fabric.attach(PROVIDER, router.handle_pm)
        d: GoDirectory | PyDirectory
        if kind == "go":
            d = await stack.enter_async_context(
                go_directory(fabric, binary, tmp_path / kind / "dir", POLICY, pay=pays, args=NOW)
            )
        else:
            d = await stack.enter_async_context(py_directory(fabric, tmp_path / kind / "dir"))
            d.payer.credit[PROVIDER] = lambda atoms: harness.credit(DIRECTORY, atoms)
        p = await stack.enter_async_context(session(router, DIRECTORY))
        admin_router = await stack.enter_async_context(fabric.router(ADMIN))
        a = await stack.enter_async_context(session(admin_router, DIRECTORY))

        # Our own extensions (export_registry) are not the reference's to compare.
        got["public"] = sorted(t.name for t in (await p.list_tools()).tools if t.name not in EXTENSION_TOOLS)
        got["all"] = {t.name: t.meta for t in (await a.list_tools()).tools if t.name not in EXTENSION_TOOLS}
        record("policy", await p.call_tool("policy", {}))
        del got["policy"]["name"], got["policy"]["pubKey"]
        record("status", await p.call_tool("my_status", {}))
        for i, bad in enumerate(REFUSED):
            record(f"refused{i}", await p.call_tool("register", bad))
        record("invoice", await p.call_tool("register", REGISTRATION))
        await d.credit_tip(PROVIDER, 1_000)
        record("partial", await p.call_tool("my_status", {}))
        await d.credit_tip(PROVIDER, COST - 1_000)

        async def parked() -> bool:
            result = await p.call_tool("my_status", {})
            return (result.structured_content or {}).get("state") == "pending_review"

        await until(parked, limit=60)
        record("parked", await p.call_tool("my_status", {}))
        record("queue", await a.call_tool("pending_registrations", {}))
        record("approve", await a.call_tool("approve", {"uid": PROVIDER}))
        record("approve_again", await a.call_tool("approve", {"uid": PROVIDER}))
        record("listed", await p.call_tool("my_status", {}))
        record("search", await a.call_tool("search", {"query": "PROBE"}))
        record("cheap", await a.call_tool("search", {"maxPriceAtoms": 1}))
        record("by_tag", await a.call_tool("search", {"tags": [" INTEROP "]}))
        record("provider", await a.call_tool("get_provider", {"uid": PROVIDER}))
        record("no_provider", await a.call_tool("get_provider", {"uid": ADMIN}))
        record("categories", await a.call_tool("list_categories", {}))
        record("snapshot_unpaid", await a.call_tool("get_snapshot", {}))
        await d.credit_tip(ADMIN, SNAPSHOT_PRICE)
        record("snapshot", await a.call_tool("get_snapshot", {}))
        signed = got.pop("snapshot")
        got["snapshot"] = json.loads(base64.b64decode(signed["payload"]))
        record("stats", await a.call_tool("stats", {}))
        for tool, args in [
            ("pursue_lead", {"uid": PROVIDER}),
            ("verify_peer", {"uid": PROVIDER}),
            ("add_peer", {"uid": "ab", "pubKey": "x"}),
            ("unlist", {"uid": ADMIN}),
            ("reject", {"uid": ADMIN}),
            ("recrawl", {"uid": ADMIN}),
        ]:
            record(f"{tool}_refused", await a.call_tool(tool, args))
        record("unlist", await a.call_tool("unlist", {"uid": PROVIDER}))
        record("unlisted", await p.call_tool("my_status", {}))
        record("stats_after", await a.call_tool("stats", {}))
        got["runs"] = runs
        got["provider_balance"] = await harness.balance(DIRECTORY)
        got["escrow"] = await d.balance(PROVIDER)
    return got


async def test_both_directories_answer_alike(tmp_path: Path, goref_binary: Path) -> None:
    """The same provider and admin, the same calls, at the reference's
    directory and at ours: the same answers, the same money (the refusals'
    words are compared in the next test)."""
    python_directory()
    go = await answers("go", tmp_path, goref_binary)
    py = await answers("py", tmp_path, goref_binary)
    for i in range(len(REFUSED)):
        assert "error" in go.pop(f"refused{i}")
        assert "error" in py.pop(f"refused{i}")
    assert py == go
    # A few pins, so the comparison cannot pass on two empty runs.
    assert go["listed"] == {"state": "listed", "expiresAt": EXPIRES}
    assert go["search"]["total"] == 1
    assert (go["runs"], go["provider_balance"], go["escrow"]) == (
        [{"text": "probe"}],
        0,
        TEST_MAX - TEST_PRICE,
    )


async def test_refusals_read_as_the_reference_words_them(tmp_path: Path, goref_binary: Path) -> None:
    python_directory()
    go = await answers("go", tmp_path, goref_binary)
    py = await answers("py", tmp_path, goref_binary)
    assert [py[f"refused{i}"] for i in range(len(REFUSED))] == [
        go[f"refused{i}"] for i in range(len(REFUSED))
    ]
