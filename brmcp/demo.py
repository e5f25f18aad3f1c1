"""``brmcp demo``: the whole chain on one machine, with real protocols.

In one process on loopback it starts a simulated Bison Relay network (a fake
relay and two fake brclients, each serving real TLS clientrpc), the
``brmcp-serve`` example bot connected to one brclient over clientrpc, and the
``brmcp-bridge`` daemon connected to the other (autopay, caps set for the
demo). It then acts as a stock MCP agent with the official SDK's
streamable-HTTP client against the bridge endpoint: it lists the tools with
their prices, calls the free ``echo`` and the paid ``fortune``
(pay alongside: the tip and the marked call together → credit → result; or
payment_required → tip → credit → reissue with the same callKey → result),
and prints a transcript: each step, the relay PMs it took, the bot's ledger
and the bridge's spend log. Facts that must hold (one execution, one
charge, consistent books) are checked; any failure names its step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO, TypeVar

import anyio
import anyio.abc
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent, Tool

from . import wire
from ._ops.progress import StepPrinter
from .protocol.payment import CALL_KEY, PRICE_ATOMS_KEY, PRICING_KEY, parse_payment_required
from .testing import Fabric, Faults

__all__ = ["DemoError", "DemoOptions", "DemoReport", "run_demo"]

T = TypeVar("T")

log = logging.getLogger("brmcp.demo")

#: Spending policy of the demo's bridge, in atoms (1 DCR = 100,000,000 atoms).
DEMO_PER_CALL_CAP = 20_000
DEMO_PER_DAY_CAP = 100_000
ECHO_TEXT = "hello over Bison Relay"
STEPS = 8
#: Why ``--network real`` cannot run without Go (one line; brnet, the real
#: network, is a Go program built on first use).
NO_GO = (
    "--network real needs Go >= 1.22 to build brnet, the real Bison Relay network: install Go from "
    "https://go.dev/dl/ (or your package manager) so that 'go' is on PATH; plain 'brmcp demo' needs no Go"
)


class DemoError(Exception):
    """A demo step failed; the message names the step and the reason."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """``latency_ms``: per-PM relay latency in milliseconds (with 20 %
    jitter), to feel a real relay. ``port``: the bridge's loopback port (0
    picks a free one). ``datadir``: keep every file there instead of a
    temporary directory (removed at the end). ``keep_running``: after the
    transcript, leave the network and bridge up and print how to connect
    other agents. ``step_timeout``: seconds any one step may take (None:
    60 s plus 20 times the latency). ``network``: ``"fake"`` (the in-memory
    relay and fake brclients) or ``"real"`` (brnet: a real bisonrelay relay
    and real clients on loopback, built with Go on first use; ``latency_ms``
    is then added one way to every message a client sends to the relay)."""

    latency_ms: float = 0.0
    network: str = "fake"
    port: int = 0
    datadir: Path | None = None
    keep_running: bool = False
    step_timeout: float | None = None


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _check_port(port: int) -> None:
    """Raise :class:`DemoError` (one line naming the address) when the
    bridge's ``127.0.0.1:port`` cannot be bound now; port 0 always passes."""
    from .metrics.endpoint import cannot_listen, probe_listen

    try:
        probe_listen("127.0.0.1", port)
    except OSError as exc:
        raise DemoError(cannot_listen("127.0.0.1", port, exc, option="--port")) from None


def _price_text(tool: Tool) -> str:
    meta = tool.meta or {}
    if meta.get(PRICING_KEY) == "dynamic":
        return "dynamic price"
    price = meta.get(PRICE_ATOMS_KEY)
    if price == 0:
        return "free"
    if isinstance(price, int | float):
        return f"{int(price)} atoms"
    return "no price advertised"


def _text_of(result: CallToolResult) -> str:
    return "".join(item.text for item in result.content if isinstance(item, TextContent))


def _result_and_notes(result: CallToolResult) -> tuple[str, list[str]]:
    """The tool's own text (the first text item) and any further text items
    (notes the bridge adds to what the bot answered, e.g. what it paid)."""
    texts = [item.text for item in result.content if isinstance(item, TextContent)]
    return (texts[0] if texts else ""), texts[1:]


class _Trace:
    """Fabric tap: reassembles the MCP messages crossing the relay and keeps
    one readable line per message (with its PM count) for the transcript."""

    def __init__(self, nicks: dict[str, str]) -> None:
        self._nicks = nicks
        self._assembler = wire.Assembler()
        self._methods: dict[tuple[str, str, Any], str] = {}
        self._parts: dict[tuple[str, str, str], int] = {}
        self.lines: list[str] = []

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines

    def __call__(self, from_uid: str, to_uid: str, text: str) -> None:
        who = f"{self._nicks.get(from_uid, from_uid[:8])} → {self._nicks.get(to_uid, to_uid[:8])}"
        part = wire.parse(text)
        if part is None:
            self.lines.append(f"{who}  chat: {text[:40]!r}")
            return
        key = (from_uid, part.sid, part.mid)
        self._parts[key] = self._parts.get(key, 0) + 1
        try:
            payload = self._assembler.add(from_uid, part, time.time())
        except wire.WireError as exc:
            self.lines.append(f"{who}  dropped part: {exc}")
            return
        if payload is None:
            return
        pms = self._parts.pop(key, 1)
        try:
            message = json.loads(payload)
        except ValueError:
            self.lines.append(f"{who}  non-JSON payload of {len(payload)} bytes")
            return
        summary = self._summarize(from_uid, to_uid, part.sid, message)
        suffix = f"  [{pms} PMs]" if pms > 1 else ""
        self.lines.append(f"{who}  {summary}{suffix}")

    def _summarize(self, from_uid: str, to_uid: str, sid: str, message: Any) -> str:
        if not isinstance(message, dict):
            return "not a JSON-RPC object"
        method = message.get("method")
        raw_params = message.get("params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        if isinstance(method, str):
            if "id" in message:
                self._methods[(from_uid, sid, json.dumps(message["id"]))] = method
            if method == "initialize":
                return f"initialize (protocol {params.get('protocolVersion')})"
            if method == "tools/call":
                args = json.dumps(params.get("arguments") or {}, separators=(",", ":"))
                key = (params.get("_meta") or {}).get(CALL_KEY)
                return f"tools/call {params.get('name')} {_clip(args, 40)}" + (
                    f" callKey {key}" if key else ""
                )
            return method
        answered = self._methods.pop((to_uid, sid, json.dumps(message.get("id"))), "?")
        if "error" in message:
            error = message.get("error") or {}
            return f"error for {answered}: {error.get('code')} {_clip(str(error.get('message')), 60)}"
        result = message.get("result") or {}
        if answered == "tools/list":
            return f"tools/list result: {len(result.get('tools') or [])} tools with prices in _meta"
        if answered == "initialize":
            info = result.get("serverInfo") or {}
            return f"initialize result: {info.get('name')} {info.get('version')}"
        if answered == "tools/call":
            try:
                call = CallToolResult.model_validate(result)
            except ValueError:
                return "tools/call result (unreadable)"
            refusal = parse_payment_required(call)
            if refusal is not None:
                return (
                    f"payment_required: price {refusal.price_atoms}, balance {refusal.balance_atoms}, "
                    f"shortfall {refusal.shortfall_atoms} atoms"
                )
            kind = "tool error" if call.is_error else "result"
            return f"tools/call {kind}: {_clip(_text_of(call), 60)}"
        return f"{answered} result"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Demo:
    def __init__(self, options: DemoOptions, out: TextIO, tty: bool | None) -> None:
        self.options = options
        self.printer = StepPrinter(out, STEPS, tty=tty)
        self.report = DemoReport()
        if options.step_timeout is not None:
            self.timeout = options.step_timeout
        else:
            self.timeout = 60.0 + 20 * options.latency_ms / 1000.0
        self.fabric: Fabric | None = None
        self.trace: _Trace | None = None
        self.observer: _PMObserver | None = None

    # -- helpers ---------------------------------------------------------------------

    def _counting(self) -> bool:
        return self.fabric is not None or self.observer is not None

    def _relay_pms(self) -> int:
        if self.observer is not None:
            return self.observer.count
        assert self.fabric is not None
        return self.fabric.stats.pms_delivered

    @contextlib.asynccontextmanager
    async def _step(self, title: str, key: str) -> AsyncIterator[None]:
        before = self._relay_pms() if self._counting() else 0
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
        if self._counting():
            if self.observer is not None:
                await self.observer.settle()
            pms = self._relay_pms() - before
            self.report.pms[key] = pms

    def _pms_line(self, key: str, note: str, *, extra: dict[str, str] | None = None) -> None:
        """Print the relay PMs of the last step: the count, then one line
        per MCP message (``extra`` inserts a line after the first line
        containing its key)."""
        self.printer.detail(f"relay PMs: {self.report.pms.get(key, 0)} ({note})")
        lines = self.trace.take() if self.trace is not None else []
        inserts = dict(extra or {})
        for line in lines:
            self.printer.detail(f"  {line}")
            for marker, text in list(inserts.items()):
                if marker in line:
                    self.printer.detail(f"  {text}")
                    del inserts[marker]
        for text in inserts.values():  # no line had its marker: shown last
            self.printer.detail(f"  {text}")

    # -- the run -----------------------------------------------------------------------

    async def run(self, root: Path) -> DemoReport:
        # Imported here: the fake brclient and the example bot are test and
        # example code that the library proper does not need.
        from .bridge import BridgeDaemon, Settings
        from .clientrpc import write_bot_config
        from .serve import ServeApp, init_datadir

        options = self.options
        printer = self.printer
        report = self.report
        _check_port(options.port)
        latency = options.latency_ms / 1000.0
        faults = Faults(latency=latency, jitter=latency * 0.2) if latency > 0 else Faults()
        client_options = {"backoff_initial": 0.2, "backoff_max": 2.0}

        async with contextlib.AsyncExitStack() as stack:
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)

            if options.network == "real":
                await self._build_brnet()
                async with self._step("Start a real Bison Relay network (brnet)", "network"):
                    net = await tg.start(self._real_network, root)
                    bot, alice = net.user("bot"), net.user("alice")
                    self.trace = _Trace({bot.uid: "bot", alice.uid: "alice"})
                    self.observer = _PMObserver(self.trace, client_options)
                    await tg.start(self.observer.run, bot, alice)
                report.bot_uid, report.alice_uid = bot.uid, alice.uid
                printer.detail(f"relay {net.info['relay']} (bisonrelay server), root {net.root}")
                printer.detail(f"bot   uid {bot.uid}  brclient clientrpc {bot.url}")
                printer.detail(f"alice uid {alice.uid}  brclient clientrpc {alice.url}")
                printer.detail(
                    "real bisonrelay clients, KX'd; tips through a simulated wallet"
                    + (f"; {options.latency_ms:.0f} ms added one way" if latency else "")
                )
            else:
                async with self._step("Start a simulated Bison Relay network", "network"):
                    fabric, bot, alice = await tg.start(self._network, root, faults)
                    self.fabric = fabric
                    self.trace = _Trace({bot.uid: "bot", alice.uid: "alice"})
                    fabric.add_tap(self.trace)
                report.bot_uid, report.alice_uid = bot.uid, alice.uid
                printer.detail(f"bot   uid {bot.uid}  brclient clientrpc {bot.url}")
                printer.detail(f"alice uid {alice.uid}  brclient clientrpc {alice.url}")
                printer.detail(
                    "the two are contacts; PMs cross the in-memory relay"
                    + (f" with {options.latency_ms:.0f} ms latency" if latency else "")
                )

            async with self._step("Start the bot: brmcp-serve on bot's brclient", "serve"):
                serve_dir = root / "brmcp-serve"
                init_datadir(
                    serve_dir, bot_config=_bot_config(bot, serve_dir, "brmcp-serve"), allowed_uids=[alice.uid]
                )
                app = ServeApp.from_datadir(serve_dir, client_options=client_options)
                await tg.start(app.run)
                await app.client.wait_connected()
            printer.detail(f"data dir {serve_dir}; allowed caller: alice; tools echo (free), fortune (paid)")

            async with self._step("Start the bridge: brmcp-bridge on alice's brclient", "bridge"):
                bridge_dir = root / "brmcp-bridge"
                bridge_dir.mkdir(parents=True, exist_ok=True)
                write_bot_config(
                    bridge_dir / "brmcp-bridge.conf", _bot_config(alice, bridge_dir, "brmcp-bridge")
                )
                port = options.port or _free_port()
                daemon = BridgeDaemon.from_datadir(
                    bridge_dir, listen=f"127.0.0.1:{port}", client_options=client_options
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
                report.tools[tool.name] = _price_text(tool)
                printer.detail(f"{tool.name:<8} {report.tools[tool.name]:<12} {tool.description or ''}")
            self._pms_line("list", "served from the bridge's snapshot")
            if "echo" not in report.tools or "fortune" not in report.tools:
                raise DemoError(f"the bot did not list echo and fortune (got {sorted(report.tools)})")

            async with self._step(f'Agent calls echo {{"text": "{ECHO_TEXT}"}}', "echo"):
                echo = await session.call_tool("echo", {"text": ECHO_TEXT})
            report.echo_text, notes = _result_and_notes(echo)
            printer.detail(f"result {report.echo_text}")
            for note in notes:
                printer.detail(f"note   {note}")
            self._pms_line("echo", "one round trip: the call and its result")
            if echo.is_error or json.loads(report.echo_text or "null") != {"echo": ECHO_TEXT}:
                raise DemoError(f"echo returned an unexpected result: {report.echo_text!r}")

            executions_before = app.harness.executions
            async with self._step("Agent calls fortune (paid: the bridge pays with a tip)", "fortune"):
                fortune = await session.call_tool("fortune", {})
            report.fortune, notes = _result_and_notes(fortune)
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
                self._print_connect_help(
                    snippet.url, snippet.token, snippet.name, snippet.mcp_json, bridge_dir
                )
                await _wait_for_signal()
        return report

    async def _network(
        self, root: Path, faults: Faults, *, task_status: anyio.abc.TaskStatus[tuple[Fabric, Any, Any]]
    ) -> None:
        """Own the relay and both fake brclients for the whole run."""
        from .testing.fakebr import FakeBRClient, FakeRelay

        async with Fabric(seed=7, faults=faults) as fabric, FakeRelay(fabric) as relay:
            bot = FakeBRClient(relay, "bot", root / "brclient-bot")
            alice = FakeBRClient(relay, "alice", root / "brclient-alice")
            relay.kx(bot, alice)
            async with bot, alice:
                task_status.started((fabric, bot, alice))
                await anyio.sleep_forever()

    async def _build_brnet(self) -> None:
        """Build brnet (Go) before the first step, outside the step timeout:
        the first build downloads and compiles bisonrelay (minutes); its
        progress goes to stderr, so the transcript on stdout stays clean."""
        from .testing.brnet import BrNetBuildError, BrNetUnavailable, GoNotFound, brnet_binary

        try:
            exe = await anyio.to_thread.run_sync(partial(brnet_binary, progress=_to_stderr))
        except GoNotFound:
            raise DemoError(NO_GO) from None
        except BrNetUnavailable as exc:
            raise DemoError(f"--network real cannot build brnet: {exc}") from None
        except BrNetBuildError as exc:
            raise DemoError(f"{exc.summary} (Go's output is above)") from None
        self.printer.line(f"brnet (the real Bison Relay network): {exe}")

    async def _real_network(self, root: Path, *, task_status: anyio.abc.TaskStatus[Any]) -> None:
        """Own a brnet (users bot and alice) for the whole run."""
        from .testing.brnet import BrNet, BrNetError

        net = BrNet(
            root / "brnet",
            users=("bot", "alice"),
            latency_ms=self.options.latency_ms,
            tip_restart_delay=1.0,
            reconnect_delay=0.5,
        )
        try:
            await anyio.to_thread.run_sync(net.start)
        except BrNetError as exc:
            raise DemoError(f"brnet did not start: {exc}") from None
        try:
            task_status.started(net)
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(net.stop)

    def _print_connect_help(
        self, url: str, token: str, name: str, mcp_json: dict[str, Any], bridge_dir: Path
    ) -> None:
        p = self.printer
        p.line()
        p.line("The network and the bridge keep running (Ctrl-C to stop). Connect any MCP agent:")
        p.line(f"  endpoint: {url}")
        p.line(f"  token:    {token}")
        p.line()
        p.line("  Claude Code:")
        p.line(f'    claude mcp add --transport http {name} {url} --header "Authorization: Bearer {token}"')
        p.line("  .mcp.json:")
        for text in json.dumps(mcp_json, indent=2).splitlines():
            p.line(f"    {text}")
        p.line("  MCP Inspector CLI (needs Node.js >= 22; -y lets npx install it without asking):")
        p.line(
            f"    npx -y @modelcontextprotocol/inspector@2.12.0 --cli {url} --transport http "
            f'--header "Authorization: Bearer {token}" --method tools/list'
        )
        p.line()
        p.line(f"  The bridge's data directory is {bridge_dir}; its commands work against it:")
        for command in ("spend", "settings", "approvals", "ui"):
            p.line(f"    brmcp-bridge --datadir {bridge_dir} {command}")
        p.line("  (the demo bridge pays without asking; 'settings set mode=approval' makes it ask, and")
        p.line("  'approvals' or the page from 'ui' then decide each payment)")
        p.line()


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _bot_config(user: Any, datadir: Path, name: str) -> Any:
    """A bot config for ``user`` (a fake brclient or a brnet user) naming ``datadir``."""
    if hasattr(user, "bot_config_for"):
        return user.bot_config_for(datadir, name)
    return user.bot_config(datadir, name)


class _PMObserver:
    """Counts and traces the PMs between the two real brclients by listening on
    each one's PM stream (without acking: the bot and the bridge ack their
    own). A PM received by the bot came from alice and the other way round."""

    def __init__(self, trace: _Trace, client_options: dict[str, Any]) -> None:
        self.trace = trace
        self.client_options = client_options
        self.count = 0
        self._last = time.monotonic()

    async def settle(self, quiet: float = 0.3, limit: float = 3.0) -> None:
        """Wait until no PM arrived for ``quiet`` seconds (at most ``limit``),
        so a step's count includes PMs still in flight when it returned."""
        deadline = time.monotonic() + limit
        while True:
            now = time.monotonic()
            if now >= deadline or now - self._last >= quiet:
                return
            await anyio.sleep(0.05)

    async def run(self, bot: Any, alice: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with (
            bot.client(**self.client_options) as at_bot,
            alice.client(**self.client_options) as at_alice,
            anyio.create_task_group() as tg,
        ):
            await at_bot.wait_connected()
            await at_alice.wait_connected()
            subs = [(at_bot.pm_stream(), alice.uid, bot.uid), (at_alice.pm_stream(), bot.uid, alice.uid)]
            for sub, _, _ in subs:
                await sub.wait_open()
            for sub, sender, receiver in subs:
                tg.start_soon(self._drain, sub, sender, receiver)
            task_status.started()

    async def _drain(self, sub: Any, sender: str, receiver: str) -> None:
        async for pm in sub:
            if pm.uid != sender:
                continue
            self.count += 1
            self._last = time.monotonic()
            self.trace(sender, receiver, pm.message)


def _verify(report: DemoReport) -> None:
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


def demo_main(options: DemoOptions, *, verbose: bool = False) -> int:
    """Run the demo from the command line; returns the exit status."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    real = options.network == "real"
    if real:
        from .testing.brnet import go_executable

        if go_executable() is None:
            print(f"brmcp demo: {NO_GO}", file=sys.stderr)
            return 1
    try:
        _check_port(options.port)
    except DemoError as exc:
        print(f"brmcp demo: {exc}", file=sys.stderr)
        return 1
    kind = "a real Bison Relay network (brnet)" if real else "a simulated Bison Relay network"
    print(f"brmcp demo: an MCP agent pays a bot per call over {kind}")
    print()
    started = time.monotonic()
    try:
        anyio.run(run_demo, options)
    except DemoError as exc:
        print(f"\nbrmcp demo failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nbrmcp demo interrupted", file=sys.stderr)
        return 130
    print(f"Total time {time.monotonic() - started:.1f} s.")
    return 0
