"""The provider side of the directory (brmcp/directory/provider/_registrant.py;
docs/directory.md, "The provider side"; karamble/brmcp,
``directory/registrant.go``): the auto-fund policy, the fund history
written before money moves, listings left alone or renewed, hostile
directories that never get more than the caps, and ``listing_invite``
deciding on the caller's uid.

The directory here is a small fake: a harness with ``register`` and
``my_status`` answering StatusOut JSON, on the in-memory fabric; the
provider is a harness with the Registrant's tool on the same fabric.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession

from brmcp import ManualClock, Router
from brmcp.directory.model import (
    STATE_AWAITING_FUNDING,
    STATE_LISTED,
    STATE_NONE,
    STATE_PENDING_REVIEW,
    InviteOut,
    RegisterIn,
    StatusOut,
    TestSpec,
)
from brmcp.directory.provider import (
    FUND_FILE,
    FUND_WINDOW_SECS,
    RENEW_AHEAD_SECS,
    AutoFund,
    FundEntry,
    FundHistory,
    Registrant,
    RegistrantConfig,
    RegistrantError,
    RegistrationError,
)
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid
from tests.kit import until

PROVIDER = uid(40)
DIRECTORY = uid(41)
OTHER_DIRECTORY = uid(42)
FEE = 1_000
BUDGET = 500
COST = FEE + BUDGET
START = 1_800_000_000.0
DAY = 24 * 3600
CALL_TIMEOUT = 30.0

CONFIG = RegistrantConfig(
    description="echo services",
    tags=("echo",),
    test=TestSpec(tool="paid_echo", args={"text": "proof"}, max_atoms=BUDGET),
)


def funded(**policy: Any) -> AutoFund:
    """An enabled policy; the caps default to one registration per request
    and ten per month."""
    policy.setdefault("max_atoms_per_request", COST)
    policy.setdefault("max_atoms_per_month", 10 * COST)
    return AutoFund(enabled=True, **policy)


class FakeDirectory:
    """A directory's ``register`` and ``my_status`` on a harness. Honest by
    default: ``register`` invoices the listing fee plus the asked test
    budget, a paid invoice moves to ``pending_review``. ``register_reply``
    and ``status_reply`` replace the answers (a dict is sent as JSON, a str
    verbatim); ``hang`` names tools that never answer."""

    def __init__(self, clock: ManualClock, data_dir: Path) -> None:
        self.clock = clock
        self.harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers={PROVIDER}))
        self.state = STATE_NONE
        self.expires_at = 0
        self.fee = FEE
        self.budget = 0
        self.balance = 0
        self.registrations: list[RegisterIn] = []
        self.status_calls = 0
        self.register_reply: Callable[[], Any] | None = None
        self.status_reply: Callable[[], Any] | None = None
        self.hang: set[str] = set()
        self.hung = anyio.Event()
        self.harness.add_tool(
            "register", self._register, description="register", input_schema={"type": "object"}
        )
        self.harness.add_tool(
            "my_status", self._my_status, description="my_status", input_schema={"type": "object"}
        )

    def credit(self, atoms: int) -> None:
        self.balance += atoms

    def list_until(self, expires_at: float) -> None:
        self.state, self.expires_at = STATE_LISTED, int(expires_at)

    def status(self) -> StatusOut:
        if self.state == STATE_AWAITING_FUNDING and self.balance >= self.fee + self.budget:
            self.state = STATE_PENDING_REVIEW
        if self.state == STATE_AWAITING_FUNDING:
            required = self.fee + self.budget
            return StatusOut(
                state=self.state,
                required_atoms=required,
                balance_atoms=self.balance,
                shortfall_atoms=max(0, required - self.balance),
                fee_atoms=self.fee,
                test_budget_atoms=self.budget,
            )
        if self.state == STATE_LISTED:
            return StatusOut(state=self.state, expires_at=self.expires_at)
        return StatusOut(state=self.state, fee_atoms=self.fee, test_budget_atoms=self.budget)

    async def _answer(self, tool: str, reply: Callable[[], Any] | None) -> Any:
        if tool in self.hang:
            self.hung.set()
            await anyio.sleep_forever()
        value = reply() if reply is not None else self.status().to_json()
        return value if isinstance(value, str) else json.dumps(value)

    async def _register(self, ctx: CallContext, args: dict[str, Any]) -> Any:
        assert ctx.peer == PROVIDER
        reg = RegisterIn.from_json(args)
        self.registrations.append(reg)
        self.state, self.budget = STATE_AWAITING_FUNDING, reg.test.max_atoms
        return await self._answer("register", self.register_reply)

    async def _my_status(self, ctx: CallContext, args: dict[str, Any]) -> Any:
        self.status_calls += 1
        return await self._answer("my_status", self.status_reply)


@dataclass
class Books:
    """What the provider's payer moved: every (payee, atoms) it was asked to
    pay, and the history file's content at each payment."""

    directory: FakeDirectory
    payments: list[tuple[str, int]] = field(default_factory=list)
    history_at_payment: list[list[dict[str, Any]]] = field(default_factory=list)
    history_path: Path | None = None
    fail_with: Exception | None = None

    async def pay(self, payee_uid: str, atoms: int) -> None:
        assert self.history_path is not None
        self.history_at_payment.append(json.loads(self.history_path.read_text()))
        if self.fail_with is not None:
            raise self.fail_with
        self.payments.append((payee_uid, atoms))
        self.directory.credit(atoms)

    @property
    def paid(self) -> int:
        return sum(atoms for _, atoms in self.payments)


@dataclass
class Net:
    fabric: Fabric
    clock: ManualClock
    directory: FakeDirectory
    provider: Harness
    provider_router: Router
    directory_router: Router
    books: Books
    data_dir: Path
    notes: list[tuple[str, StatusOut | None, Exception | None]]
    stack: AsyncExitStack
    tg: anyio.abc.TaskGroup

    def registrant(self, fund: AutoFund | None = None, **config: Any) -> Registrant:
        cfg = RegistrantConfig(
            description=CONFIG.description,
            tags=CONFIG.tags,
            test=CONFIG.test,
            auto_fund=fund if fund is not None else AutoFund(),
            **config,
        )
        return Registrant(
            cfg,
            payer=self.books,
            data_dir=self.data_dir,
            router=self.provider_router,
            clock=self.clock,
            notify=lambda d, st, err: self.notes.append((d, st, err)),
            call_timeout=CALL_TIMEOUT,
        )

    def history(self) -> list[dict[str, Any]]:
        path = self.data_dir / FUND_FILE
        return json.loads(path.read_text()) if path.exists() else []

    def assert_books_balance(self) -> None:
        """Every atom paid reached the directory and is in the history."""
        assert self.directory.balance == self.books.paid
        assert all(payee == DIRECTORY for payee, _ in self.books.payments)
        assert sum(e["atoms"] for e in self.history()) >= self.books.paid

    @asynccontextmanager
    async def as_directory(self) -> AsyncIterator[ClientSession]:
        """An SDK session from the directory's uid to the provider."""
        conn = self.directory_router.dial(PROVIDER)
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=10) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def network(tmp_path: Path, *, directory_allowed: tuple[str, ...] = (DIRECTORY,)) -> AsyncIterator[Net]:
    clock = ManualClock(START)
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        directory = FakeDirectory(clock, tmp_path / "directory")
        provider = Harness(
            HarnessConfig(data_dir=tmp_path / "provider-bot", allowed_peers=set(directory_allowed))
        )

        @provider.tool(price_atoms=BUDGET, description="A paid echo")
        async def paid_echo(ctx: CallContext, text: str = "") -> dict[str, Any]:
            return {"text": text}

        await stack.enter_async_context(provider)
        await stack.enter_async_context(directory.harness)
        provider_router = await provider.start(fabric.sender(PROVIDER))
        fabric.attach(PROVIDER, provider_router.handle_pm)
        directory_router = await directory.harness.start(fabric.sender(DIRECTORY))
        fabric.attach(DIRECTORY, directory_router.handle_pm)
        data_dir = tmp_path / "provider"
        books = Books(directory, history_path=data_dir / FUND_FILE)
        tg = await stack.enter_async_context(anyio.create_task_group())
        net = Net(
            fabric,
            clock,
            directory,
            provider,
            provider_router,
            directory_router,
            books,
            data_dir,
            [],
            stack,
            tg,
        )
        with anyio.fail_after(30):
            yield net
        tg.cancel_scope.cancel()


# -- the policy ------------------------------------------------------------------------------


async def test_auto_funding_is_disabled_by_default(tmp_path: Path) -> None:
    assert AutoFund() == AutoFund.from_json(None) == AutoFund.from_json({})
    async with network(tmp_path) as net:
        reg = net.registrant()
        with pytest.raises(RegistrationError, match="funding declined: auto-funding is disabled") as info:
            await reg.register(DIRECTORY)
        assert info.value.status is not None
        assert info.value.status.shortfall_atoms == COST
        assert net.books.payments == []
        assert net.history() == []
        assert len(net.directory.registrations) == 1
        # The operator hears of the invoice through notify.
        (directory, status, error) = net.notes[-1]
        assert directory == DIRECTORY
        assert status is not None
        assert status.shortfall_atoms == COST
        assert isinstance(error, RegistrationError)


async def test_pays_the_shortfall_within_the_per_request_cap(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        status = await net.registrant(funded()).register(DIRECTORY)
        assert status.state == STATE_PENDING_REVIEW
        assert net.books.payments == [(DIRECTORY, COST)]
        assert net.history() == [{"ts": int(START), "directoryUid": DIRECTORY, "atoms": COST}]
        assert net.notes == [(DIRECTORY, status, None)]
        reg = net.directory.registrations[0]
        assert reg == RegisterIn(description="echo services", tags=("echo",), test=CONFIG.test)
        net.assert_books_balance()


async def test_per_request_cap_one_atom_short_declines(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        reg = net.registrant(funded(max_atoms_per_request=COST - 1))
        with pytest.raises(RegistrationError, match=f"{COST} atoms exceeds the {COST - 1} per-request cap"):
            await reg.register(DIRECTORY)
        assert net.books.payments == []
        assert net.history() == []


async def test_partial_balance_pays_only_the_shortfall(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        net.directory.credit(400)
        await net.registrant(funded()).register(DIRECTORY)
        assert net.books.payments == [(DIRECTORY, COST - 400)]
        assert net.directory.balance == COST


async def test_rolling_thirty_day_cap(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        # Go's file: paid 2 * COST 29 days ago and 5 * COST 31 days ago.
        net.data_dir.mkdir()
        (net.data_dir / FUND_FILE).write_text(
            json.dumps(
                [
                    {"ts": int(START) - 31 * DAY, "directoryUid": OTHER_DIRECTORY, "atoms": 5 * COST},
                    {"ts": int(START) - 29 * DAY, "directoryUid": OTHER_DIRECTORY, "atoms": 2 * COST},
                ],
                indent=2,
            )
        )
        reg = net.registrant(funded(max_atoms_per_month=3 * COST - 1))
        with pytest.raises(RegistrationError, match=r"would exceed the 4499 monthly cap \(3000 spent\)"):
            await reg.register(DIRECTORY)
        assert net.books.payments == []
        # Two days later the 29-day-old payment left the window.
        net.clock.advance(2 * DAY)
        await reg.register(DIRECTORY)
        assert net.books.payments == [(DIRECTORY, COST)]
        assert reg.history.total_since(int(net.clock.now()) - FUND_WINDOW_SECS) == COST
        # An exact fill of the month is allowed, one atom over is not.
        wide = net.registrant(funded(max_atoms_per_request=10 * COST, max_atoms_per_month=3 * COST - 1))
        await wide.history.load()
        room = 3 * COST - 1 - COST
        assert wide.refusal(DIRECTORY, room) is None
        assert (
            wide.refusal(DIRECTORY, room + 1)
            == f"{room + 1} atoms would exceed the 4499 monthly cap (1500 spent)"
        )


async def test_allowed_directories(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        reg = net.registrant(funded(allowed_directory_uids=(OTHER_DIRECTORY,)))
        with pytest.raises(RegistrationError, match="directory not in allowed_directory_uids"):
            await reg.register(DIRECTORY)
        assert net.books.payments == []
        reg = net.registrant(funded(allowed_directory_uids=(OTHER_DIRECTORY, DIRECTORY)))
        await reg.register(DIRECTORY)
        assert net.books.payments == [(DIRECTORY, COST)]


def test_auto_fund_json_keys_and_errors() -> None:
    fund = AutoFund.from_json(
        {
            "Enabled": True,
            "max_atoms_per_request": 10,
            "max_atoms_per_month": 20,
            "allowed_directory_uids": [DIRECTORY.upper()],
        }
    )
    assert fund == AutoFund(True, 10, 20, (DIRECTORY,))
    assert fund.to_json() == {
        "enabled": True,
        "max_atoms_per_request": 10,
        "max_atoms_per_month": 20,
        "allowed_directory_uids": [DIRECTORY],
    }
    bad = [
        ({"enabled": "yes"}, r'auto_fund\.enabled: "yes" is not allowed: use true or false'),
        ({"max_atoms_per_month": -1}, r"auto_fund\.max_atoms_per_month: -1 is not allowed"),
        ({"enabled": True, "max_atoms_per_month": 5}, r"auto_fund\.max_atoms_per_request: 0 is not allowed"),
        ({"allowed_directory_uids": ["ab"]}, r'auto_fund\.allowed_directory_uids\[0\]: "ab" is not a Bison'),
    ]
    for value, message in bad:
        with pytest.raises(RegistrantError, match=message):
            AutoFund.from_json(value)


# -- the fund history --------------------------------------------------------------------------


async def test_history_is_written_before_paying(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        await net.registrant(funded()).register(DIRECTORY)
        # At the moment of payment the entry was already on disk.
        assert net.books.history_at_payment == [
            [{"ts": int(START), "directoryUid": DIRECTORY, "atoms": COST}]
        ]
        text = (net.data_dir / FUND_FILE).read_text()
        assert text == json.dumps([{"ts": int(START), "directoryUid": DIRECTORY, "atoms": COST}], indent=2)
        assert (net.data_dir / FUND_FILE).stat().st_mode & 0o777 == 0o600


async def test_a_crash_between_record_and_pay_only_over_counts(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        net.books.fail_with = RuntimeError("process killed")
        reg = net.registrant(funded(max_atoms_per_month=COST))
        with pytest.raises(RegistrationError, match="funding payment of 1500 atoms: process killed"):
            await reg.register(DIRECTORY)
        assert net.directory.balance == 0  # the money never moved...
        # ... but a restart counts it against the month: no second payment.
        net.books.fail_with = None
        restarted = net.registrant(funded(max_atoms_per_month=COST))
        with pytest.raises(RegistrationError, match="monthly cap"):
            await restarted.register(DIRECTORY)
        assert net.books.payments == []
        assert [e["atoms"] for e in net.history()] == [COST]


async def test_fund_history_round_trip_and_corruption(tmp_path: Path) -> None:
    history = FundHistory(tmp_path / "d" / FUND_FILE)
    await history.load()
    await history.record(FundEntry(1000, "a", 300))
    await history.record(FundEntry(2000, "b", 200))
    assert (history.total_since(0), history.total_since(1500), history.total_since(2001)) == (500, 200, 0)
    again = FundHistory(tmp_path / "d" / FUND_FILE)
    await again.load()
    assert again.entries == history.entries
    (tmp_path / "bad.json").write_text('{"ts": 1}')
    with pytest.raises(RegistrantError, match=r"bad\.json: fund history corrupt: expected a JSON array"):
        await FundHistory(tmp_path / "bad.json").load()
    (tmp_path / "bad.json").write_text('[{"ts": 1, "directoryUid": "a", "atoms": -5}]')
    with pytest.raises(RegistrantError, match="entry 0 needs"):
        await FundHistory(tmp_path / "bad.json").load()


# -- listings: left alone or renewed ----------------------------------------------------------


async def test_a_fresh_listing_is_left_alone(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        net.directory.list_until(START + RENEW_AHEAD_SECS + 1)
        status = await net.registrant(funded()).register(DIRECTORY)
        assert status == StatusOut(state=STATE_LISTED, expires_at=int(START) + RENEW_AHEAD_SECS + 1)
        assert net.directory.registrations == []
        assert net.books.payments == []
        assert net.notes == [(DIRECTORY, status, None)]


async def test_a_listing_within_seven_days_of_expiry_is_renewed(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        net.directory.list_until(START + 6 * DAY)
        status = await net.registrant(funded()).register(DIRECTORY)
        assert len(net.directory.registrations) == 1
        assert net.books.payments == [(DIRECTORY, COST)]
        assert status.state == STATE_PENDING_REVIEW


# -- hostile directories ------------------------------------------------------------------


def invoice(**fields: Any) -> Callable[[], dict[str, Any]]:
    base = {
        "state": STATE_AWAITING_FUNDING,
        "requiredAtoms": COST,
        "shortfallAtoms": COST,
        "feeAtoms": FEE,
        "testBudgetAtoms": BUDGET,
    }
    return lambda: {**base, **fields}


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        # A fee above the cap, consistently invoiced.
        (
            invoice(requiredAtoms=10**9 + BUDGET, shortfallAtoms=10**9 + BUDGET, feeAtoms=10**9),
            "per-request cap",
        ),
        # A shortfall inflated past the invoice.
        (invoice(shortfallAtoms=COST + 1), "shortfallAtoms 1501 above requiredAtoms 1500"),
        # A required total that is not fee + budget.
        (invoice(requiredAtoms=COST + 100, shortfallAtoms=COST + 100), "is not feeAtoms"),
        # A test budget larger than the one asked for.
        (invoice(testBudgetAtoms=BUDGET + 1, feeAtoms=FEE - 1), "testBudgetAtoms 501 above the 500"),
        # A shortfall in a state that is not awaiting funding.
        (invoice(state=STATE_LISTED), "a shortfall in state 'listed'"),
        # Garbage.
        (lambda: "not json at all", "not a status"),
        (lambda: {"state": STATE_AWAITING_FUNDING, "shortfallAtoms": "lots"}, "not a status"),
        (lambda: [1, 2, 3], "not a status"),
        (lambda: {"shortfallAtoms": 2**70}, "not a status"),
    ],
)
async def test_a_hostile_invoice_is_never_paid(
    tmp_path: Path, reply: Callable[[], Any], message: str
) -> None:
    async with network(tmp_path) as net:
        net.directory.register_reply = reply
        reg = net.registrant(funded(max_atoms_per_request=10 * COST))
        with pytest.raises(RegistrationError, match=message):
            await reg.register(DIRECTORY)
        assert net.books.payments == []
        assert net.history() == []
        assert net.notes[-1][2] is not None
        net.assert_books_balance()


async def test_a_directory_that_keeps_asking_is_paid_once_per_registration(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        # It never moves past awaiting_funding, whatever it was paid.
        net.directory.status_reply = net.directory.register_reply = invoice()
        reg = net.registrant(funded(max_atoms_per_month=2 * COST))
        status = await reg.register(DIRECTORY)
        assert status.shortfall_atoms == COST  # it still asks
        assert net.books.payments == [(DIRECTORY, COST)]
        # Asking again is paid again only within the month's cap.
        await reg.register(DIRECTORY)
        with pytest.raises(RegistrationError, match="monthly cap"):
            await reg.register(DIRECTORY)
        assert net.books.paid == 2 * COST
        net.assert_books_balance()


async def test_a_directory_that_never_answers_times_out_without_paying(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        net.directory.hang = {"register"}
        reg = net.registrant(funded())
        outcome: list[BaseException] = []

        async def attempt() -> None:
            try:
                await reg.register(DIRECTORY)
            except RegistrationError as exc:
                outcome.append(exc)

        net.tg.start_soon(attempt)
        await net.directory.hung.wait()
        await until(lambda: net.clock.sleepers >= 1)
        net.clock.advance(CALL_TIMEOUT)
        await until(lambda: bool(outcome))
        assert "register: the directory did not answer within 30 s" in str(outcome[0])
        assert net.books.payments == []
        assert net.history() == []


async def test_an_unreachable_directory_is_reported(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        net.fabric.set_offline(DIRECTORY)
        reg = net.registrant(funded())
        outcome: list[BaseException] = []

        async def attempt() -> None:
            try:
                await reg.register(DIRECTORY)
            except RegistrationError as exc:
                outcome.append(exc)

        net.tg.start_soon(attempt)
        await until(lambda: net.clock.sleepers >= 1)
        net.clock.advance(CALL_TIMEOUT)
        await until(lambda: bool(outcome))
        assert "did not answer within 30 s" in str(outcome[0])
        assert net.notes[-1][0] == DIRECTORY
        assert net.notes[-1][1] is None
        assert net.books.payments == []


async def test_a_bad_uid_is_refused(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        with pytest.raises(ValueError, match="not 64 hex"):
            await net.registrant(funded()).register("not-a-uid")


# -- listing_invite and proactive registration -------------------------------------------------


async def invite(net: Net, args: dict[str, Any]) -> InviteOut:
    async with net.as_directory() as session:
        result = await session.call_tool("listing_invite", args)
    assert not result.is_error, result
    text = "".join(getattr(block, "text", "") for block in result.content)
    return InviteOut.from_json(json.loads(text))


async def test_invite_decides_on_the_caller_uid_not_the_payload(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        reg = net.registrant(funded(allowed_directory_uids=(DIRECTORY,)))
        reg.register_tools(net.provider)
        await net.tg.start(reg.run)
        # The payload names another directory: the caller is who registers.
        out = await invite(net, {"directory": OTHER_DIRECTORY, "listingFeeAtoms": FEE, "note": "join us"})
        assert out == InviteOut(accepted=True)
        await until(lambda: net.books.payments == [(DIRECTORY, COST)])
        await until(lambda: len(net.notes) == 1)
        assert net.notes[0][0] == DIRECTORY
        assert net.notes[0][2] is None
        assert len(net.directory.registrations) == 1


async def test_invite_from_a_directory_not_allowed_is_declined(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        # Only OTHER_DIRECTORY is allowed; the caller claims to be it.
        reg = net.registrant(funded(allowed_directory_uids=(OTHER_DIRECTORY,)))
        reg.register_tools(net.provider)
        await net.tg.start(reg.run)
        out = await invite(net, {"directory": OTHER_DIRECTORY, "listingFeeAtoms": FEE})
        assert out == InviteOut(accepted=False, note="directory not in allowed_directory_uids")
        assert net.notes == [
            (DIRECTORY, StatusOut(note="invite declined: directory not in allowed_directory_uids"), None)
        ]
        assert net.directory.registrations == []
        assert net.books.payments == []


@pytest.mark.parametrize(
    ("fund", "fee", "note"),
    [
        (AutoFund(), FEE, "auto-funding is disabled"),
        (funded(), FEE + 1, f"{COST + 1} atoms exceeds the {COST} per-request cap"),
        (funded(), -(10**6), "listingFeeAtoms must be >= 0"),
    ],
)
async def test_invite_declines_what_the_policy_refuses(
    tmp_path: Path, fund: AutoFund, fee: int, note: str
) -> None:
    async with network(tmp_path) as net:
        reg = net.registrant(fund)
        reg.register_tools(net.provider)
        await net.tg.start(reg.run)
        out = await invite(net, {"directory": "x", "listingFeeAtoms": fee})
        assert out == InviteOut(accepted=False, note=note)
        assert net.directory.registrations == []


async def test_repeated_invites_run_one_registration(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        net.directory.hang = {"register"}
        reg = net.registrant(funded())
        reg.register_tools(net.provider)
        await net.tg.start(reg.run)
        invited = await invite(net, {"directory": OTHER_DIRECTORY, "listingFeeAtoms": FEE})
        assert invited == InviteOut(accepted=True)
        await net.directory.hung.wait()
        again = await invite(net, {"directory": OTHER_DIRECTORY, "listingFeeAtoms": FEE})
        assert again == InviteOut(accepted=True, note="a registration is already in progress")
        assert len(net.directory.registrations) == 1


async def test_run_registers_at_every_configured_directory(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        reg = net.registrant(funded(), register_at_uids=(DIRECTORY,))
        await net.tg.start(reg.run)
        await until(lambda: len(net.notes) == 1)
        assert net.notes[0][0] == DIRECTORY
        assert net.notes[0][2] is None
        assert net.books.payments == [(DIRECTORY, COST)]
        # A second start on a listing far from expiry pays nothing.
        net.directory.list_until(START + 30 * DAY)
        again = net.registrant(funded(), register_at_uids=(DIRECTORY,))
        await net.tg.start(again.run)
        await until(lambda: len(net.notes) == 2)
        assert net.notes[1][1] == StatusOut(state=STATE_LISTED, expires_at=int(START) + 30 * DAY)
        assert net.books.payments == [(DIRECTORY, COST)]


async def test_run_refuses_an_unreadable_fund_history(tmp_path: Path) -> None:
    async with network(tmp_path) as net:
        net.data_dir.mkdir()
        (net.data_dir / FUND_FILE).write_text("{not json")
        with pytest.raises(RegistrantError, match="fund history corrupt"):
            await net.tg.start(net.registrant(funded()).run)


async def test_a_directory_error_cannot_forge_log_lines(tmp_path: Path) -> None:
    def refuse() -> Any:
        raise RuntimeError("no\nINFO brmcp: paid 1000000 atoms")

    async with network(tmp_path) as net:
        net.directory.register_reply = refuse
        with pytest.raises(RegistrationError) as info:
            await net.registrant(funded()).register(DIRECTORY)
        assert str(info.value).startswith("register: ")
        assert "\n" not in str(info.value)
        assert net.books.payments == []


async def test_the_default_notify_is_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with network(tmp_path) as net:
        reg = Registrant(CONFIG, payer=net.books, data_dir=net.data_dir, router=net.provider_router)
        logger = "brmcp.directory.provider._registrant"
        with caplog.at_level(logging.INFO, logger=logger), pytest.raises(RegistrationError):
            await reg.register(DIRECTORY)
        assert caplog.messages == [
            f"directory {DIRECTORY}: state=awaiting_funding shortfall={COST} atoms: "
            "funding declined: auto-funding is disabled"
        ]
