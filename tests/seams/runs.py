"""One run of the seam harness: a plan (drawn by hypothesis), an impatient
agent calling ``fortune`` through the bridge, one fault injected into the
first attempt, the restart of what the fault took down, the settling of the
books, and the invariants checked on the run's movements (tests/seams/README.md)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import httpx2

from brmcp.testing.fakebr import TipFailure
from tests.seams.stack import HEADERS, PRICE, Ledger, Stack, event_data

#: The faults, one per run.
FAULTS = ("ws_bot", "ws_bridge", "relay", "pg", "bot", "bridge", "http", "none")
#: Named moments of a paid call: the agent's call left the bridge (its first
#: PM), the bridge asked brclient to tip, the tip completed.
POINTS = ("call_sent", "tip_requested", "tip_completed")
TIP_USER = "PaymentsService.TipUser"
PM = "ChatService.PM"
#: Seconds the settling of the books may take after a run.
SETTLE = 90.0


@dataclass(frozen=True)
class Plan:
    """The choices of one run: the fault, its moment (a named point, else
    ``fraction`` of ``span`` seconds after the call left the agent), how long
    the tip takes and the component stays down, and the agent's retries."""

    fault: str
    point: str | None
    fraction: float
    span: float
    tip_delay: float
    down: float
    attempts: int
    timeout: float
    pause: float


@dataclass
class Outcome:
    """What one run did, as the agent and the harness saw it."""

    plan: Plan
    answered: bool = False
    attempts: int = 0
    give_ups: int = 0  #: attempts the agent abandoned (its timeout, or its HTTP connection cut)
    injected: bool = False
    errors: list[str] = field(default_factory=list)
    paid_atoms: int = 0
    charged_atoms: int = 0
    refunded_atoms: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class Totals:
    """Totals over a test's runs, written to ``BRMCP_SEAMS_REPORT``."""

    backend: str
    seed: int
    runs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)
    answered: int = 0
    attempts: int = 0
    give_ups: int = 0
    paid_atoms: int = 0
    charged_atoms: int = 0
    refunded_atoms: int = 0
    credit_atoms: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, outcome: Outcome, credit: int) -> None:
        self.runs += 1
        self.faults[outcome.plan.fault] += 1
        if outcome.injected:
            self.injected[outcome.plan.fault] += 1
        self.answered += outcome.answered
        self.attempts += outcome.attempts
        self.give_ups += outcome.give_ups
        self.paid_atoms += outcome.paid_atoms
        self.charged_atoms += outcome.charged_atoms
        self.refunded_atoms += outcome.refunded_atoms
        self.credit_atoms = credit
        if outcome.problems:
            self.failures.append(
                {
                    "run": self.runs,
                    "plan": asdict(outcome.plan),
                    "problems": outcome.problems,
                    "errors": outcome.errors,
                }
            )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["faults"] = dict(self.faults)
        out["injected"] = dict(self.injected)
        return out


class Agent:
    """An impatient MCP agent over streamable HTTP: one MCP session per
    logical call (opened again when the bridge no longer knows it), the
    identical ``tools/call`` re-sent after each give-up."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session: dict[str, str] | None = None
        self.next_id = 10

    async def _open(self, http: httpx2.AsyncClient) -> dict[str, str] | None:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "seams-agent", "version": "1"},
            },
        }
        opened = await http.post(self.url, json=init, headers=HEADERS)
        if opened.status_code != 200:
            return None
        headers = {
            **HEADERS,
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-11-25",
        }
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        if (await http.post(self.url, json=note, headers=headers)).status_code != 202:
            return None
        return headers

    async def attempt(self, http: httpx2.AsyncClient) -> dict[str, Any] | str:
        """One ``tools/call fortune``: the JSON-RPC answer, or a short text
        saying why there is none."""
        for _ in range(2):
            if self.session is None:
                self.session = await self._open(http)
                if self.session is None:
                    return "session refused"
            self.next_id += 1
            body = {
                "jsonrpc": "2.0",
                "id": self.next_id,
                "method": "tools/call",
                "params": {"name": "fortune"},
            }
            async with http.stream("POST", self.url, json=body, headers=self.session) as response:
                if response.status_code == 404:  # the bridge restarted: the session is gone
                    self.session = None
                    continue
                if response.status_code != 200:
                    return f"HTTP {response.status_code}"
                if response.headers.get("content-type", "").startswith("application/json"):
                    value = json.loads(await response.aread())
                    return value if isinstance(value, dict) else "not an object"
                async for line in response.aiter_lines():
                    message = event_data(line)
                    if message is not None and message.get("id") == self.next_id:
                        return message
                return "stream ended without an answer"
        return "session lost twice"


async def until(predicate: Callable[[], bool], limit: float, every: float = 0.01) -> bool:
    """Poll ``predicate`` every ``every`` seconds (it reads state of several
    processes and fakes, which share no event); False when ``limit`` seconds
    passed first."""
    with anyio.move_on_after(limit):
        while True:
            if predicate():
                return True
            await anyio.sleep(every)
    return False


def _count(stack: Stack, method: str) -> int:
    return sum(1 for m, _ in stack.alice.requests if m == method)


async def _reached(stack: Stack, plan: Plan, done: anyio.Event) -> bool:
    """Wait for the plan's moment; False when the attempt ended first."""
    if plan.point is None:
        with anyio.move_on_after(plan.fraction * plan.span):
            await done.wait()
        return not done.is_set()
    marks: dict[str, Callable[[], int]] = {
        "call_sent": lambda: _count(stack, PM),
        "tip_requested": lambda: _count(stack, TIP_USER),
        "tip_completed": lambda: len(stack.tips_completed),
    }
    mark = marks[plan.point]
    before = mark()
    await until(lambda: mark() > before or done.is_set(), 3600)
    return mark() > before


async def _inject(stack: Stack, plan: Plan, scope: anyio.CancelScope) -> None:
    """Apply the plan's fault and restart what it took down."""
    fault = plan.fault
    if fault == "ws_bot":
        stack.bot.drop_connections()
    elif fault == "ws_bridge":
        stack.alice.drop_connections()
    elif fault == "relay":
        await stack.relay_stop()
        await anyio.sleep(plan.down)
        await stack.relay_start()
    elif fault == "pg":
        stack.terminate_store_backends()
    elif fault == "bot":
        await stack.serve.kill()
        await anyio.sleep(plan.down)
        await stack.start_serve()
    elif fault == "bridge":
        await stack.bridge.kill()
        await anyio.sleep(plan.down)
        await stack.start_bridge()
    elif fault == "http":
        scope.cancel()


async def _attempt(agent: Agent, plan: Plan, out: Outcome, scope: anyio.CancelScope) -> dict[str, Any] | str:
    with scope:
        try:
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(plan.timeout + 5, connect=5)) as http:
                return await agent.attempt(http)
        except (httpx2.HTTPError, OSError, json.JSONDecodeError) as exc:
            return f"connection: {type(exc).__name__}"
    out.give_ups += 1
    return "gave up"


async def run_once(stack: Stack, plan: Plan) -> Outcome:
    """One logical call with the plan's fault, then the books settled and checked."""
    out = Outcome(plan)
    before = stack.ledger()
    started, completed, received = (
        len(stack.tips_started),
        len(stack.tips_completed),
        len(stack.tips_received),
    )
    if plan.tip_delay > 0:
        stack.alice.fail_next_tip(TipFailure(attempts=0, delay=plan.tip_delay))
    agent = Agent(stack.url)
    while out.attempts < plan.attempts and not out.answered:
        if out.attempts:
            await anyio.sleep(plan.pause)
        out.attempts += 1
        scope = anyio.CancelScope(deadline=anyio.current_time() + plan.timeout)
        answer: list[dict[str, Any] | str] = []
        done = anyio.Event()

        async def call(
            scope: anyio.CancelScope = scope, answer: list[Any] = answer, done: anyio.Event = done
        ) -> None:
            try:
                answer.append(await _attempt(agent, plan, out, scope))
            finally:
                done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            if out.attempts == 1 and plan.fault != "none" and await _reached(stack, plan, done):
                out.injected = True
                await _inject(stack, plan, scope)
        message = answer[0]
        result = message.get("result") if isinstance(message, dict) else None
        if isinstance(result, dict) and not result.get("isError"):
            out.answered = True
        else:
            out.errors.append(json.dumps(message)[-300:])
    await _settle(stack, out, started)
    after = stack.ledger()
    _check(stack, out, before, after, completed, received)
    return out


async def _settle(stack: Stack, out: Outcome, started: int) -> None:
    """Wait until every tip started completed and reached the bot's book, and
    the book stopped moving."""

    def tips_done() -> bool:
        return len(stack.tips_completed) == len(stack.tips_started)

    if not await until(tips_done, SETTLE):
        out.problems.append(
            f"{len(stack.tips_started) - started} tips started this run, "
            f"{len(stack.tips_started) - len(stack.tips_completed)} never completed"
        )
    booked = sum(stack.tips_received)

    def in_book() -> bool:
        return stack.ledger().total("tip") * 1000 >= booked

    if not await until(in_book, SETTLE, every=0.1):
        out.problems.append(f"tips received {booked} matoms never all reached the bot's ledger")
    # Quiet: a call the agent gave up on may still be paid or charged; the
    # run's movements are the ones made before the book is still for 1 s.
    last = stack.ledger().movements
    while True:
        await anyio.sleep(1.0)
        now = stack.ledger().movements
        if now == last:
            return
        last = now


def _check(stack: Stack, out: Outcome, before: Ledger, after: Ledger, completed: int, received: int) -> None:
    """The invariants of tests/seams/README.md on the run's movements."""
    p = out.problems
    new = after.movements[len(before.movements) :]
    if after.movements[: len(before.movements)] != before.movements:
        p.append("the ledger's earlier movements changed")
    paid_matoms = sum(stack.tips_completed[completed:])
    out.paid_atoms = paid_matoms // 1000
    tips_booked = sum(a for k, a, _ in new if k == "tip")
    charges = [(a, key) for k, a, key in new if k == "charge"]
    refunds = sum(a for k, a, _ in new if k in ("refund", "recovery_refund"))
    out.charged_atoms = -sum(a for a, _ in charges)
    out.refunded_atoms = refunds
    # 1. The book is balanced: the payer's balance is the sum of its movements,
    #    and it is the only balance (one payer).
    if after.balance != sum(a for _, a, _ in after.movements):
        p.append(f"balance {after.balance} != sum of movements {sum(a for _, a, _ in after.movements)}")
    if after.all_balances != after.balance:
        p.append(f"sum of balances {after.all_balances} != the payer's {after.balance}")
    if after.balance < 0:
        p.append(f"negative balance {after.balance}")
    # 2. Tips: completed by the wallet == received by the bot's brclient == booked.
    received_matoms = sum(stack.tips_received[received:])
    if not (paid_matoms == received_matoms == tips_booked * 1000):
        p.append(
            f"tips: wallet completed {paid_matoms}, bot received {received_matoms},"
            f" booked {tips_booked * 1000} matoms"
        )
    # 3. At most one charge per callKey, over the whole life of the stack.
    keys = after.charge_keys()
    if len(keys) != len(set(keys)):
        p.append(f"a callKey charged twice: {[k for k, n in Counter(keys).items() if n > 1]}")
    if any(a != -PRICE for a, _ in charges):
        p.append(f"charges of other than {PRICE}: {charges}")
    # 4. Every atom charged and not refunded is behind a result an agent
    #    received, or an answer that crossed one of the agent's give-ups
    #    (BRIDGE.md §Resumability); the rest stays the user's credit.
    kept = out.charged_atoms - refunds
    results = PRICE * out.answered
    if kept < results:
        p.append(f"a result received without its charge: kept {kept}, results {results} atoms")
    crossed = (kept - results) // PRICE
    if crossed > out.give_ups:
        p.append(
            f"{kept} atoms charged and kept for {out.answered} result(s) received"
            f" and {out.give_ups} give-up(s)"
        )
    # 5. The impatient agent got its answer within its attempts.
    if not out.answered:
        p.append(f"no answer in {out.attempts} attempts: {out.errors}")
