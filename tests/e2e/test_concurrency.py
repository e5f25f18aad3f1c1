"""Many agents at once on one bot, through brclients paced as real ones:
every call is answered and the relay carries about two PMs per call (the
request and its reply), instead of collapsing under copies re-sent while
earlier ones still wait in brclient's paced queue.

The stack is brmcp-serve's and brmcp-bridge's on the fake relay: a harness
serving the example tools (``echo`` is free; rate limit out of the way) on
the bot's fake brclient, a bridge on the user's, both brclients with
``pm_pacing`` 0.1 s (a real brclient's ≈ 104 ms between the PMs of one
direction; its ``PM`` call returns at once). Each side sends through its
fake brclient's ``PM`` method, as the serve app and the daemon do over
clientrpc; the PMs the relay delivers go straight to the harness's and the
bridge's routers, as those programs feed them from brclient's PM stream.
The agents use the bridge's in-process call path (the one its MCP endpoint
serves). Everything runs in virtual time (trio's ``MockClock``; the
fabric's delivery times are pointed at it), so every PM is counted on the
fabric and the run is the same each time.

Relay PMs per call: every PM the fabric accepted from either brclient
(``FabricStats.pms_sent``, dropped ones included) from the first of these
calls until the relay's queues are empty again, divided by the calls.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
import trio._core._run as trio_run
from mcp.shared.exceptions import MCPError
from trio.testing import MockClock

import brmcp.testing.fabric as fabric_module
from brmcp import RouterOptions
from brmcp.bridge import Bridge
from brmcp.clientrpc.types import PM, pm_params
from brmcp.serve.app import IMPLEMENTATION_NAME, IMPLEMENTATION_VERSION
from brmcp.serve.tools import register_tools
from brmcp.server import Harness, HarnessConfig
from brmcp.testing import Fabric, Faults
from brmcp.testing.fakebr import FakeBRClient, FakeRelay
from brmcp.testing.fakebr.params import Pairs
from tests.kit import BOT, CLIENT
from tests.kit.bridge import TestPayer, fabric_bridge, fixture_settings, joined

#: A real brclient's spacing of the PMs of one direction (≈ 104 ms measured).
PACING = 0.1
#: The relay's own delivery time (a real one: 8 to 25 ms).
LATENCY = 0.02
AGENTS = 16
CALLS_PER_AGENT = 3
#: Relay PMs per call allowed: the request and the reply, plus a little.
PMS_PER_CALL = 2.1
#: Virtual seconds every call must be answered within. The paced queues
#: alone take AGENTS x CALLS_PER_AGENT x PACING ≈ 5 s to carry 48 requests;
#: this is twelve times that, so only a stall or a collapse misses it.
DEADLINE = 60.0
#: The fabric's seed. With 20 % of the PMs dropped, it drops the first PM
#: after the faults are turned on and the fourth (then about one in five).
SEED = 18
DROP_RATE = 0.2


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` on trio with a clock that jumps to the next timer once
    every task has waited 10 ms of real time. Not at once: the bridge writes
    its snapshots in a worker thread, and a clock that jumped while the loop
    waits for that thread would fire re-send timers the run would not reach."""
    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0.01)})


@pytest.fixture(autouse=True)
def virtual_fabric(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fabric times its deliveries with anyio's clock (the virtual one),
    and trio's scheduler, which runs ready tasks in a random order, draws
    that order from a seeded generator: with PMs dropped at random, which
    ones are lost depends on that order."""
    monkeypatch.setattr(fabric_module, "time", SimpleNamespace(monotonic=anyio.current_time, time=time.time))
    monkeypatch.setattr(trio_run, "_r", random.Random(SEED))


class Brclient:
    """A program's :class:`~brmcp.PMSender` on its brclient: brclient's
    ``ChatService.PM`` on ``fake``, as the serve app's and the daemon's
    clientrpc client calls it (the PM is queued and the call returns)."""

    def __init__(self, fake: FakeBRClient) -> None:
        self.fake = fake

    async def send_pm(self, peer: str, text: str) -> None:
        params = json.loads(json.dumps(pm_params(peer, text)), object_pairs_hook=Pairs)
        await self.fake._methods.execute(PM, params, True)


def serve_harness(data_dir: Path, batches: bool) -> Harness:
    """brmcp-serve's harness: the example tools, the caller allowed, no rate
    limit in the way; ``batches`` False: a bot that takes no batch PMs
    (WIRE.md §Batches; the Go reference), so every message is a PM of its own."""
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            allowed_peers={CLIENT},
            calls_per_minute=1_000_000,
            name=IMPLEMENTATION_NAME,
            version=IMPLEMENTATION_VERSION,
            router_options=RouterOptions() if batches else RouterOptions(batch=False),
        )
    )
    register_tools(harness)
    return harness


@dataclass
class Net:
    fabric: Fabric
    relay: FakeRelay
    bridge: Bridge

    async def settle(self) -> None:
        """Wait until nothing is left in the relay's queues or on the fabric
        (re-sent copies and the replies to them included)."""
        stats = self.fabric.stats
        with anyio.fail_after(DEADLINE):
            while True:
                before = stats.pms_sent
                await anyio.sleep(10 * PACING)
                if self.relay.pms_queued == 0 and stats.pms_sent == before:
                    accounted = stats.pms_delivered + stats.pms_dropped - stats.pms_duplicated
                    if accounted == stats.pms_sent:
                        return


@asynccontextmanager
async def paced_stack(tmp_path: Path, batches: bool, seed: int = SEED) -> AsyncIterator[Net]:
    """The fabric (seeded, :data:`LATENCY`), the fake relay, the bot's and
    the user's fake brclients (paced), the serve harness at BOT
    (:func:`serve_harness`) and the bridge at CLIENT (the daemon's options)."""
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric(seed=seed, faults=Faults(latency=LATENCY)))
        relay = await stack.enter_async_context(FakeRelay(fabric))
        bot_br = FakeBRClient(relay, "bot", tmp_path / "br" / "bot", uid=BOT, pm_pacing=PACING)
        user_br = FakeBRClient(relay, "user", tmp_path / "br" / "user", uid=CLIENT, pm_pacing=PACING)
        relay.kx(bot_br, user_br)
        harness = await stack.enter_async_context(serve_harness(tmp_path / "serve", batches))
        router = await harness.start(Brclient(bot_br))
        fabric.attach(BOT, router.handle_pm)
        data_dir = tmp_path / "bridge"
        data_dir.mkdir()
        (data_dir / "mcpclient.json").write_text(fixture_settings().to_json())
        bridge = fabric_bridge(
            fabric, data_dir, TestPayer(), sender=Brclient(user_br), listen=None, uid=CLIENT
        )
        await stack.enter_async_context(bridge)
        relay.set_online(BOT)
        relay.set_online(CLIENT)
        yield Net(fabric, relay, bridge)


@dataclass
class Run:
    calls: int
    answered: int
    errors: list[str]
    seconds: float
    pms: int
    dropped: int

    @property
    def per_call(self) -> float:
        return self.pms / self.calls

    def line(self) -> str:
        return (
            f"{self.answered}/{self.calls} calls answered in {self.seconds:.1f} virtual s,"
            f" {self.pms} relay PMs ({self.per_call:.2f} per call), {self.dropped} dropped,"
            f" errors: {self.errors[:3]}"
        )


async def first_contact(net: Net) -> None:
    """One call, alone (the bridge learns the bot's tools and the round
    trip), and everything it sent settled."""
    with anyio.fail_after(DEADLINE):
        warm = await net.bridge._proxy(BOT).call("echo", {"text": "first contact"})
    assert not warm.is_error, joined(warm)
    await net.settle()


async def many_calls(net: Net, agents: int, per_agent: int) -> Run:
    """``agents`` agents each making ``per_agent`` echo calls at once
    (after :func:`first_contact`); the relay's PMs counted from the first
    of them until everything has settled."""
    proxy = net.bridge._proxy(BOT)
    stats = net.fabric.stats
    sent, dropped = stats.pms_sent, stats.pms_dropped
    answered = 0
    errors: list[str] = []

    async def one(agent: int, n: int) -> None:
        nonlocal answered
        text = f"agent {agent} call {n}"
        try:
            result = await proxy.call("echo", {"text": text})
        except MCPError as exc:
            errors.append(exc.error.message)
            return
        if result.is_error or result.structured_content != {"echo": text}:
            errors.append(joined(result))
            return
        answered += 1

    async def agent(number: int) -> None:
        async with anyio.create_task_group() as calls:
            for n in range(per_agent):
                calls.start_soon(one, number, n)

    start = anyio.current_time()
    with anyio.move_on_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            for number in range(agents):
                tg.start_soon(agent, number)
    seconds = anyio.current_time() - start
    await net.settle()
    return Run(
        calls=agents * per_agent,
        answered=answered,
        errors=errors,
        seconds=seconds,
        pms=stats.pms_sent - sent,
        dropped=stats.pms_dropped - dropped,
    )


BATCHES = pytest.mark.parametrize("batches", [True, False], ids=["batches", "bot-without-batches"])


@pytest.mark.paced  # counts PMs: the batching depends on the real pacing
@BATCHES
def test_sixteen_agents_three_calls_each_about_two_pms_per_call(tmp_path: Path, batches: bool) -> None:
    """48 free calls at once on a clean relay: every one answered within the
    deadline, at most 2.1 relay PMs per call."""

    async def main() -> None:
        async with paced_stack(tmp_path, batches) as net:
            await first_contact(net)
            run = await many_calls(net, AGENTS, CALLS_PER_AGENT)
            print(run.line())
            assert run.errors == [], run.line()
            assert run.answered == run.calls, run.line()
            assert run.per_call <= PMS_PER_CALL, run.line()

    run_virtual(main)


@pytest.mark.paced  # counts PMs: the batching depends on the real pacing
@BATCHES
def test_sixteen_calls_on_a_lossy_relay_recover_each_drop_in_a_few_pms(tmp_path: Path, batches: bool) -> None:
    """16 free calls at once while the relay drops 20 % of the PMs: every
    call answered within the deadline, and the relay PMs stay within 2.1
    per call plus two per dropped PM (a lost request costs one re-sent
    copy; a lost reply one re-sent copy and the reply to it)."""

    async def main() -> None:
        async with paced_stack(tmp_path, batches) as net:
            await first_contact(net)
            net.fabric.faults = Faults(latency=LATENCY, drop_rate=DROP_RATE)
            run = await many_calls(net, AGENTS, 1)
            print(run.line())
            assert run.dropped > 0, run.line()  # the seed drops the first PM
            assert run.errors == [], run.line()
            assert run.answered == run.calls, run.line()
            assert run.pms <= PMS_PER_CALL * run.calls + 2 * run.dropped, run.line()

    run_virtual(main)
