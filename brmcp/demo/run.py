"""One ``brmcp demo`` run (:func:`run_demo`): the network (fake or real),
the ``brmcp-serve`` bot on one brclient, the ``brmcp-bridge`` daemon on the
other, then a stock MCP agent (the SDK's streamable-HTTP client) that lists
the tools, calls ``echo`` and pays for ``fortune``; each of the eight steps
has a timeout and a failure names its step. The books are checked at the
end (:class:`DemoReport`: one execution, one charge, amounts that add up)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO, TypeVar

import anyio
import anyio.abc
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from .._ops.progress import StepPrinter
from ..clientrpc import BotConfig
from .fakenet import FakeNetwork
from .options import (
    DEMO_PER_CALL_CAP,
    DEMO_PER_DAY_CAP,
    ECHO_TEXT,
    STEPS,
    DemoError,
    DemoOptions,
    check_port,
    step_timeout,
)
from .realnet import RealNetwork
from .transcript import Trace, price_text, print_connect_help, print_pms, result_and_notes

__all__ = ["DemoReport", "run_demo"]

T = TypeVar("T")

log = logging.getLogger("brmcp.demo")

#: clientrpc options of the bot, the bridge and the PM observer: quick redials.
CLIENT_OPTIONS: dict[str, Any] = {"backoff_initial": 0.2, "backoff_max": 2.0}


@dataclass(slots=True)
class DemoReport:
    """What the demo observed (all amounts in atoms)."""

    bot_uid: str = ""
    alice_uid: str = ""
    endpoint: str = ""
    token: str = ""
    tools: dict[str, str] = field(default_factory=dict)  #: name -> advertised price text
    echo_text: str = ""
    fortune: str = ""
    fortune_executions: int = 0
    charges: list[int] = field(default_factory=list)  #: charges in the bot's statement for alice
    tips_credited: list[int] = field(default_factory=list)
    bot_balance: int = 0
    spend_entries: list[dict[str, Any]] = field(default_factory=list)
    spend_total: int = 0
    pms: dict[str, int] = field(default_factory=dict)  #: step name -> relay PMs it took


class _Network(Protocol):
    """What a run needs of its network (:class:`~.fakenet.FakeNetwork`,
    :class:`~.realnet.RealNetwork`)."""

    title: str
    trace: Trace | None

    async def prepare(self, printer: StepPrinter) -> None: ...

    async def start(self, tg: anyio.abc.TaskGroup, root: Path) -> tuple[Any, Any]: ...

    def relay_pms(self) -> int | None: ...

    async def settle(self) -> None: ...

    def describe(self, printer: StepPrinter, bot: Any, alice: Any) -> None: ...

    def bot_config(self, user: Any, datadir: Path, name: str) -> BotConfig: ...


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Demo:
    def __init__(self, options: DemoOptions, out: TextIO, tty: bool | None) -> None:
        self.options = options
        self.printer = StepPrinter(out, STEPS, tty=tty)
        self.report = DemoReport()
        self.timeout = step_timeout(options)
        self.network: _Network = (
            RealNetwork(options, CLIENT_OPTIONS) if options.network == "real" else FakeNetwork(options)
        )

    @contextlib.asynccontextmanager
    async def _step(self, title: str, key: str) -> AsyncIterator[None]:
        before = self.network.relay_pms() or 0
        try:
            async with self.printer.step(title):
                with anyio.fail_after(self.timeout):
                    yield
        except Exception as exc:
            leaves = _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
            for leaf in leaves:
                if isinstance(leaf, DemoError):
                    raise leaf from None
            if any(isinstance(leaf, TimeoutError) for leaf in leaves):
                raise DemoError(f"step '{title}' timed out after {self.timeout:.1f} s") from None
            raise DemoError(f"step '{title}' failed: {_describe(exc)}") from exc
        if self.network.relay_pms() is not None:
            await self.network.settle()
            self.report.pms[key] = (self.network.relay_pms() or 0) - before

    def _pms_line(self, key: str, note: str, *, extra: dict[str, str] | None = None) -> None:
        """Print the relay PMs of the last step and its MCP messages."""
        trace = self.network.trace
        lines = trace.take() if trace is not None else []
        print_pms(self.printer, self.report.pms.get(key, 0), note, lines, extra=extra)

    async def run(self, root: Path) -> DemoReport:
        # Imported here: the daemons are only needed once a run starts.
        from ..bridge import BridgeDaemon, Settings
        from ..clientrpc import write_bot_config
        from ..serve import ServeApp, init_datadir

        options = self.options
        printer = self.printer
        report = self.report
        network = self.network
        check_port(options.port)

        async with contextlib.AsyncExitStack() as stack:
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)

            await network.prepare(printer)
            async with self._step(network.title, "network"):
                bot, alice = await network.start(tg, root)
            report.bot_uid, report.alice_uid = bot.uid, alice.uid
            network.describe(printer, bot, alice)

            async with self._step("Start the bot: brmcp-serve on bot's brclient", "serve"):
                serve_dir = root / "brmcp-serve"
                init_datadir(
                    serve_dir,
                    bot_config=network.bot_config(bot, serve_dir, "brmcp-serve"),
                    allowed_uids=[alice.uid],
                )
                app = ServeApp.from_datadir(serve_dir, client_options=CLIENT_OPTIONS)
                await tg.start(app.run)
                await app.client.wait_connected()
            printer.detail(f"data dir {serve_dir}; allowed caller: alice; tools echo (free), fortune (paid)")

            async with self._step("Start the bridge: brmcp-bridge on alice's brclient", "bridge"):
                bridge_dir = root / "brmcp-bridge"
                bridge_dir.mkdir(parents=True, exist_ok=True)
                write_bot_config(
                    bridge_dir / "brmcp-bridge.conf", network.bot_config(alice, bridge_dir, "brmcp-bridge")
                )
                port = options.port or _free_port()
                daemon = BridgeDaemon.from_datadir(
                    bridge_dir, listen=f"127.0.0.1:{port}", client_options=CLIENT_OPTIONS
                )
                await tg.start(daemon.run)
                await daemon.client.wait_connected()
                await daemon.bridge.apply_settings(
                    Settings(
                        enabled=True,
                        mode="autopay",
                        per_call_cap_atoms=DEMO_PER_CALL_CAP,
                        per_day_cap_atoms=DEMO_PER_DAY_CAP,
                        allowed_bots=(bot.uid,),
                    )
                )
                snippet = daemon.bridge.config_snippet(bot.uid)
                report.endpoint, report.token = snippet.url, snippet.token
            printer.detail(f"endpoint {snippet.url}")
            printer.detail(
                f"bearer token {snippet.token}; autopay, caps {DEMO_PER_CALL_CAP} atoms per call, "
                f"{DEMO_PER_DAY_CAP} atoms per day"
            )

            # The agent's HTTP client and MCP session live in this task for the
            # rest of the run; entering them makes no request yet.
            http = httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {snippet.token}"}, timeout=httpx2.Timeout(self.timeout)
            )
            await stack.enter_async_context(http)
            read, write = await stack.enter_async_context(
                streamable_http_client(snippet.url, http_client=http)
            )
            session = await stack.enter_async_context(
                ClientSession(read, write, read_timeout_seconds=self.timeout)
            )
            async with self._step("Agent connects (MCP SDK, streamable HTTP)", "connect"):
                init = await session.initialize()
            printer.detail(
                f"server {init.server_info.name} {init.server_info.version}, protocol {init.protocol_version}"
            )
            self._pms_line("connect", "the bridge opened one BR session to the bot: initialize + tools/list")

            async with self._step("Agent lists the tools", "list"):
                listed = await session.list_tools()
            for tool in listed.tools:
                report.tools[tool.name] = price_text(tool)
                printer.detail(f"{tool.name:<8} {report.tools[tool.name]:<12} {tool.description or ''}")
            self._pms_line("list", "served from the bridge's snapshot")
            if "echo" not in report.tools or "fortune" not in report.tools:
                raise DemoError(f"the bot did not list echo and fortune (got {sorted(report.tools)})")

            async with self._step(f'Agent calls echo {{"text": "{ECHO_TEXT}"}}', "echo"):
                echo = await session.call_tool("echo", {"text": ECHO_TEXT})
            report.echo_text, notes = result_and_notes(echo)
            printer.detail(f"result {report.echo_text}")
            for note in notes:
                printer.detail(f"note   {note}")
            self._pms_line("echo", "one round trip: the call and its result")
            if echo.is_error or json.loads(report.echo_text or "null") != {"echo": ECHO_TEXT}:
                raise DemoError(f"echo returned an unexpected result: {report.echo_text!r}")

            executions_before = app.harness.executions
            async with self._step("Agent calls fortune (paid: the bridge pays with a tip)", "fortune"):
                fortune = await session.call_tool("fortune", {})
            report.fortune, notes = result_and_notes(fortune)
            report.fortune_executions = app.harness.executions - executions_before
            printer.detail(f"result {report.fortune}")
            for note in notes:
                printer.detail(f"note   {note}")
            tips = [e.atoms for e in await app.harness.statement(alice.uid) if e.kind == "tip"]
            tip_line = (
                f"alice ⇒ bot  tip of {sum(tips)} atoms: TipUser on alice's brclient, confirmed by its "
                "TipProgress stream, credited from the bot's TipStream (not a PM)"
            )
            self._pms_line(
                "fortune",
                "the bridge tips while the marked call waits at the bot (pay alongside); a bot"
                " that answers payment_required instead gets the same call again, same callKey",
                extra={"payment_required": tip_line} if tips else None,
            )
            if fortune.is_error:
                raise DemoError(f"fortune failed: {report.fortune}")

            async with self._step("Check the books", "books"):
                statement = await app.harness.statement(alice.uid)
                report.bot_balance = await app.harness.balance(alice.uid)
                report.charges = [-e.atoms for e in statement if e.kind == "charge"]
                report.tips_credited = [e.atoms for e in statement if e.kind == "tip"]
                summary = daemon.bridge.spend_log()
                report.spend_entries = [e.to_dict() for e in summary.entries]
                report.spend_total = summary.day_total_atoms
                _verify(report)
            for entry in statement:
                key = f" callKey {entry.call_key}" if entry.call_key else ""
                printer.detail(f"bot ledger, alice: {entry.kind:<7} {entry.atoms:+d} atoms{key}")
            printer.detail(f"bot ledger, alice: balance {report.bot_balance} atoms")
            for spend in summary.entries:
                line = f"{spend.tool} {spend.atoms} atoms by {spend.rail} to bot, {spend.status}"
                printer.detail(f"bridge spend log: {line}")
            printer.detail(f"bridge spend log: rolling 24 h total {summary.day_total_atoms} atoms")
            runs, charges = report.fortune_executions, len(report.charges)
            printer.detail(f"fortune ran {runs} time(s); {charges} charge(s) on the ledger")
            printer.line()
            printer.line("Demo finished: the agent paid for one fortune, exactly once.")

            if options.keep_running:
                print_connect_help(
                    printer, snippet.url, snippet.token, snippet.name, snippet.mcp_json, bridge_dir
                )
                await _wait_for_signal()
        return report


def _verify(report: DemoReport) -> None:
    """The books' facts: one execution, one charge, one paid spend entry,
    tips - charges = balance, paid = credited; DemoError listing every miss."""
    problems = []
    if report.fortune_executions != 1:
        problems.append(f"fortune ran {report.fortune_executions} times, expected once")
    if len(report.charges) != 1:
        problems.append(f"the bot's ledger shows {len(report.charges)} charges, expected one")
    paid = [e for e in report.spend_entries if e.get("status") == "paid"]
    if len(report.spend_entries) != 1 or len(paid) != 1:
        problems.append(f"the spend log has {len(report.spend_entries)} entries, expected one paid entry")
    if sum(report.tips_credited) - sum(report.charges) != report.bot_balance:
        problems.append(
            f"ledger does not add up: tips {sum(report.tips_credited)} - charges {sum(report.charges)} "
            f"!= balance {report.bot_balance}"
        )
    if paid and sum(e["atoms"] for e in paid) != sum(report.tips_credited):
        problems.append("the bridge paid a different amount than the bot was credited")
    if problems:
        raise DemoError("; ".join(problems))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if type(exc).__module__ != "builtins" else text


async def _wait_for_signal() -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


async def run_demo(
    options: DemoOptions | None = None, out: TextIO | None = None, *, tty: bool | None = None
) -> DemoReport:
    """Run the demo, printing the transcript to ``out`` (stdout by default).

    Returns the :class:`DemoReport`. Raises :class:`DemoError` naming the
    failed step (every task is cancelled and the temporary directory
    removed first).
    """
    options = options or DemoOptions()
    out = out or sys.stdout
    demo = _Demo(options, out, tty)
    owned = options.datadir is None
    try:
        root = Path(tempfile.mkdtemp(prefix="brmcp-demo-")) if owned else options.datadir
        assert root is not None
        root.mkdir(parents=True, exist_ok=True)
        if not owned and any(root.iterdir()):
            # A previous run's configs name other fake identities and ports,
            # and its spend log would count against the demo's caps.
            raise DemoError(f"the demo directory {root} is not empty; pass a new or empty directory")
    except OSError as exc:
        raise DemoError(f"cannot create the demo directory: {exc}") from None
    try:
        return await _unwrap(demo.run(root))
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)


async def _unwrap(awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except BaseExceptionGroup as group:
        demo_errors = [e for e in _leaves(group) if isinstance(e, DemoError)]
        if demo_errors:
            raise demo_errors[0] from None
        raise DemoError(_describe(group)) from None


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The non-group exceptions inside ``group``, depth first."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out
