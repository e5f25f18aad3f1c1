"""The paid-call soak: many paid calls from concurrent agents through the
bridge over a faulty fabric, with the books checked to the atom.

Used by ``tests/e2e/test_paid_soak.py`` (CI, one seed) and
``bench/paidcall_soak_bench.py`` (throughput, several seeds).

Setup: a harness bot at :data:`BOT` sells ``paid`` (:data:`PRICE` atoms,
returns the callKey it ran under and a per-bot execution number); a bridge at
:data:`CLIENT` (autopay) pays with a payer that credits the bot's ledger like
a confirmed tip. The fabric drops, duplicates and reorders PMs and a chaos
task takes the bot offline at random. Agents are official SDK clients over
the bridge's HTTP listener; each runs its share of logical calls (distinct
arguments), gives up on an attempt after its own timeout (cancelling it, as
the SDK does) and retries the same call, like a real client.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult, TextContent

from brmcp import RouterOptions
from brmcp.bridge import Bridge, RetryPolicy, Settings
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, Faults
from tests.kit import BOT, CLIENT
from tests.kit.bridge import bridge_stack

TOKEN = "soak-token-0123456789abcdef"
PRICE = 500
#: The bridge's deadline per request to the bot (its message TTL), seconds.
TTL = 12.0


@dataclass
class Tally:
    """What one soak run did; :meth:`problems` lists broken invariants."""

    seed: int
    calls: int
    agents: int
    seconds: float = 0.0
    answered: int = 0  #: logical calls whose result an agent received
    attempts: int = 0  #: tools/call requests the agents sent
    agent_timeouts: int = 0  #: attempts an agent gave up on (then retried)
    clear_errors: int = 0  #: attempts answered with an error (then retried)
    unanswered_long_waits: int = 0  #: attempts of patient agents that saw nothing before their timeout
    payments: int = 0
    paid_atoms: int = 0
    executions: int = 0  #: runs of the tool at the bot
    received_keys: set[str] = field(default_factory=set)
    executed_keys: list[str] = field(default_factory=list)
    #: executions of a call an agent gave up on while the bot had already run
    #: it (the answer was on its way): see :meth:`problems`
    raced_answers: int = 0
    unexplained_keys: list[str] = field(default_factory=list)
    credit_left: int = 0
    pms_dropped: int = 0
    pms_duplicated: int = 0
    offline_periods: int = 0
    resends: int = 0
    session_retries: int = 0  #: agent sessions that failed to open (bot away) and were opened again
    errors_seen: dict[str, int] = field(default_factory=dict)

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.answered != self.calls:
            out.append(f"{self.calls - self.answered} logical calls never answered")
        # An execution no agent received is allowed only when the bot ran it
        # before the agent gave up on that attempt (its answer was on its way
        # and the bridge wrote it to a connection still open: BRIDGE.md
        # §Resumability, "An answer that crosses the agent's give-up"); it
        # is paid like any execution. Any other is a problem.
        if self.paid_atoms != PRICE * self.executions + self.credit_left:
            out.append(
                f"books: paid {self.paid_atoms} != {PRICE} x {self.executions} executions"
                f" + {self.credit_left} credit"
            )
        if self.executions != self.answered + self.raced_answers:
            out.append(
                f"{self.executions} executions for {self.answered} received results"
                f" and {self.raced_answers} answers that crossed a give-up"
            )
        if self.raced_answers > self.agent_timeouts:
            out.append(f"{self.raced_answers} crossed answers for {self.agent_timeouts} give-ups")
        if len(set(self.executed_keys)) != len(self.executed_keys):
            out.append("a callKey ran twice")
        if self.unexplained_keys:
            out.append(f"{len(self.unexplained_keys)} executions no agent received, none crossing a give-up")
        if self.credit_left < 0:
            out.append("negative balance")
        if self.unanswered_long_waits:
            out.append(f"{self.unanswered_long_waits} attempts of patient agents got no answer in time")
        return out

    def line(self) -> str:
        return (
            f"seed {self.seed}: {self.calls} calls / {self.agents} agents in {self.seconds:.1f} s"
            f" ({self.calls / self.seconds:.1f} calls/s): answered {self.answered}, attempts {self.attempts},"
            f" agent timeouts {self.agent_timeouts}, clear errors {self.clear_errors},"
            f" payments {self.payments}, answers crossing a give-up {self.raced_answers}"
            f" ({self.paid_atoms} atoms), executions {self.executions}, credit left {self.credit_left},"
            f" PMs dropped {self.pms_dropped} duplicated {self.pms_duplicated}, bot offline"
            f" {self.offline_periods}x, bridge re-sends {self.resends},"
            f" session retries {self.session_retries}"
        )


@asynccontextmanager
async def _stack(
    tmp: Path, seed: int, faulty: bool
) -> AsyncIterator[tuple[Fabric, Harness, Bridge, list[int], list[str], list[tuple[str, str, float]]]]:
    faults = (
        Faults(latency=0.002, jitter=0.004)
        if not faulty
        else Faults(
            latency=0.002,
            jitter=0.004,
            drop_rate=0.05,
            duplicate_rate=0.05,
            reorder_rate=0.05,
            reorder_delay=0.02,
        )
    )
    paid: list[int] = []
    executed: list[str] = []
    executed_at: list[tuple[str, str, float]] = []
    harness = Harness(
        HarnessConfig(
            data_dir=tmp / "bot", allowed_peers={CLIENT}, calls_per_minute=1_000_000, name="soak-bot"
        )
    )

    async def tool(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        executed.append(ctx.call_key or "")
        executed_at.append((ctx.call_key or "", str(args.get("text")), time.monotonic()))
        return {"key": ctx.call_key, "run": len(executed), "text": args.get("text")}

    harness.add_tool("paid", tool, description="soak", input_schema={"type": "object"}, price_atoms=PRICE)

    class _Payer:
        async def pay(self, payee_uid: str, atoms: int) -> None:
            await anyio.sleep(0.005)
            await harness.credit(CLIENT, atoms)
            paid.append(atoms)

    settings = Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=10_000,
        per_day_cap_atoms=10_000_000,
        allowed_bots=(BOT,),
    )
    async with bridge_stack(
        tmp,
        _Payer(),
        bot=harness,
        settings=settings,
        fabric=Fabric(seed=seed, faults=faults),
        name="soak-bridge",
        router_options=RouterOptions(ttl=TTL),
        retry=RetryPolicy(initial=0.5, minimum=0.2, maximum=1.5, answer_timeout=8.0),
        connect_timeout=8.0,
    ) as built:
        yield built.fabric, harness, built.bridge, paid, executed, executed_at


async def run_soak(tmp: Path, *, seed: int, calls: int = 200, agents: int = 8, faults: bool = True) -> Tally:
    """One soak run; returns its tally (check :meth:`Tally.problems`).
    ``faults=False`` runs the same load on a clean fabric with the bot
    always online (the benchmark's baseline)."""
    chaos = faults
    rng = random.Random(seed)
    tally = Tally(seed=seed, calls=calls, agents=agents)
    started = time.monotonic()
    #: (text, started, ended) of every attempt the agent gave up on
    gave_up: list[tuple[str, float, float]] = []
    async with _stack(tmp, seed, faults) as (fabric, harness, bridge, paid, executed, executed_at):
        address = bridge.listen_address
        assert address is not None
        url = f"http://{address[0]}:{address[1]}/mcp/{BOT}"
        done = anyio.Event()

        async def chaos_monkey() -> None:
            while not done.is_set():
                await anyio.sleep(rng.uniform(0.5, 2.0))
                if done.is_set() or not chaos:
                    return
                fabric.set_offline(BOT)
                tally.offline_periods += 1
                await anyio.sleep(rng.uniform(0.2, 2.5))
                fabric.set_online(BOT)

        async def agent(number: int, share: list[int]) -> None:
            # Half the agents are impatient (they give up before the bridge's
            # deadline and retry); the others wait longer than it.
            patient = number % 2 == 0
            timeout = TTL + 8.0 if patient else rng.uniform(1.5, 4.0)
            pending = list(share)
            for _try in range(30):
                if not pending:
                    return
                try:
                    async with (
                        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
                        streamable_http_client(url, http_client=http) as (read, write),
                        ClientSession(read, write) as session,
                    ):
                        with anyio.fail_after(30):
                            await session.initialize()
                        await _calls(session, pending, patient, timeout)
                except Exception:
                    # Opening a session fails while the bot is away (503): the
                    # agent opens another, as a user restarting it would.
                    tally.session_retries += 1
                    await anyio.sleep(0.5)
            raise RuntimeError(f"agent {number} could not finish: {len(pending)} calls left")

        async def _calls(session: ClientSession, pending: list[int], patient: bool, give_up: float) -> None:
            while pending:
                index = pending[0]
                request = CallToolRequest(
                    params=CallToolRequestParams(name="paid", arguments={"text": f"call-{index}"})
                )
                for _attempt in range(40):
                    tally.attempts += 1
                    began = time.monotonic()
                    result: CallToolResult | None = None
                    with anyio.move_on_after(give_up) as scope:
                        try:
                            result = await session.send_request(request, CallToolResult)
                        except MCPError as exc:
                            tally.clear_errors += 1
                            kind = exc.error.message.split(":")[0][:60]
                            tally.errors_seen[kind] = tally.errors_seen.get(kind, 0) + 1
                    if scope.cancelled_caught:
                        gave_up.append((f"call-{index}", began, time.monotonic()))
                        tally.agent_timeouts += 1
                        if patient:
                            tally.unanswered_long_waits += 1
                        continue
                    if result is None:
                        await anyio.sleep(0.2)
                        continue
                    if result.is_error or not isinstance(result.structured_content, dict):
                        tally.clear_errors += 1
                        text = " ".join(c.text for c in result.content if isinstance(c, TextContent))
                        tally.errors_seen[text[:60]] = tally.errors_seen.get(text[:60], 0) + 1
                        await anyio.sleep(0.2)
                        continue
                    tally.answered += 1
                    tally.received_keys.add(str(result.structured_content["key"]))
                    break
                pending.pop(0)

        shares = [list(range(i, calls, agents)) for i in range(agents)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(chaos_monkey)
            async with anyio.create_task_group() as workers:
                for number, share in enumerate(shares):
                    workers.start_soon(agent, number, share)
            done.set()
            fabric.set_online(BOT)
        # Let in-flight work settle (late replies, credits) before the books.
        await anyio.sleep(0.5)
        tally.payments = len(paid)
        tally.paid_atoms = sum(paid)
        tally.executions = len(executed)
        tally.executed_keys = list(executed)
        for key, text, at in executed_at:
            if key in tally.received_keys:
                continue
            if any(t == text and began <= at <= ended for t, began, ended in gave_up):
                tally.raced_answers += 1
            else:
                tally.unexplained_keys.append(key)
        tally.credit_left = await harness.balance(CLIENT)
        tally.pms_dropped = fabric.stats.pms_dropped
        tally.pms_duplicated = fabric.stats.pms_duplicated
        link = bridge.link(BOT)
        tally.resends = link.resends if link is not None else 0
    tally.seconds = time.monotonic() - started
    return tally
