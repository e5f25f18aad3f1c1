"""The standalone bridge daemon (``brmcp-bridge``): a :class:`Bridge` hosted on
the user's running brclient through clientrpc (BRIDGE.md "Running the
daemon", §Embedding the library in another daemon for ``TipMatcher``;
docs/clientrpc.md §Methods brmcp calls, §Units, §Bot config file).

What the daemon supplies to the bridge:

* sender: the clientrpc :class:`~brmcp.clientrpc.Client` (``ChatService.PM``;
  fails at once with ``brclient not connected`` while disconnected);
* inbound PMs: every PM from ``ChatService.PMStream`` goes to
  :meth:`Bridge.handle_pm`, then ``AckReceivedPM``;
* payer: :class:`TipPayer` pays with ``PaymentsService.TipUser`` (``dcr_amount``
  = atoms / 1e8, 3 attempts) and returns once the matching terminal
  ``TipProgress`` event says the tip completed; a first event saying the
  attempt failed and will be retried ends the wait at once (the spend stays
  pending); a terminal event no payment waits for (it came after the tip
  wait, after such a stall, or after a restart) is a late outcome for
  :meth:`Bridge.resolve_spend`; every progress event is acked after it was
  handled (one whose outcome could not be written stays unacked, so
  brclient delivers it again); a tip outstanding for over
  :data:`TIP_SLOW_SECS` s is logged once at INFO with what it waits for
  (e.g. brclient's tip restart delay after it starts);
* the endpoint on ``listen`` (default ``127.0.0.1:8891``), bound while the
  bridge is enabled, and a runtime file that tells the CLI where the admin
  surface is (:data:`RUNTIME_FILE`).

Files in the data directory: ``brmcp-bridge.conf`` (bisonbotkit format,
created with defaults on first use), ``mcpclient.json``, ``mcpspend.json``,
``mcpadmin.token`` (the bridge's) and ``brmcp-bridge.runtime.json`` (while
running).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shlex
import signal
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from .._ops.clock import Clock, SystemClock, go_duration
from .._ops.lockfile import FileLock, acquire_brclient, acquire_datadir
from ..clientrpc import (
    BotConfig,
    Client,
    ClientrpcConnectionLost,
    ClientrpcNotConnected,
    ReceivedPM,
    RPCError,
    Subscription,
    TipProgressEvent,
    atoms_to_dcr,
    load_or_create_bot_config,
)
from ..clientrpc._glue import Acker, connection_signals, flush_on_connect
from ..transport.router import RouterOptions
from ._files import read_text, write_atomic
from .approvals import PendingPayment
from .bridge import DEFAULT_LISTEN, Bridge, BridgeConfig
from .errors import BridgeError
from .listener import parse_listen_address
from .settings import Settings
from .settle import payment_scheduled
from .tipmatcher import TipMatcher
from .ui.nicks import clientrpc_user_nick

if TYPE_CHECKING:
    from ..metrics import MetricsEndpoint

#: Seconds a matched tip outcome waits for the spend log write before its ack.
OUTCOME_WRITE_WAIT = 10.0

__all__ = [
    "BOT_CONFIG_NAME",
    "NOTIFY_KEY",
    "RUNTIME_FILE",
    "TIP_MAX_ATTEMPTS",
    "TIP_SLOW_SECS",
    "BridgeDaemon",
    "PatientSender",
    "TipPayer",
    "TipPaymentError",
    "TipStalledError",
    "load_daemon_config",
    "read_runtime",
    "resolve_listen",
    "runtime_stale_reason",
]

log = logging.getLogger("brmcp.bridge.daemon")

#: bisonbotkit config name: the daemon reads ``<datadir>/brmcp-bridge.conf``.
BOT_CONFIG_NAME = "brmcp-bridge"
#: Held (flock) while the daemon runs: one process per data directory.
LOCK_FILE = "brmcp-bridge.lock"
#: Written while the daemon runs: ``{"pid", "started", "listen", "url", "sighup"}`` (JSON,
#: mode 0600); see :func:`read_runtime`.
RUNTIME_FILE = "brmcp-bridge.runtime.json"
#: ``TipUser`` invoice attempts per payment (BRIDGE.md §Running the daemon; the Go
#: reference, karamble/brmcp, `cmd/brmcp-serve/main.go`, pays with 3 attempts too).
TIP_MAX_ATTEMPTS = 3
#: Seconds a tip may be outstanding before :class:`TipPayer` logs (once, at
#: INFO) what it waits for: brclient taking it (its ``TipUser`` blocks for
#: brclient's tip restart delay after each start) or its outcome.
TIP_SLOW_SECS = 5.0
#: ``brmcp-bridge.conf`` key: a command run on each new payment waiting for approval.
NOTIFY_KEY = "approvalnotify"
#: Seconds a notification command may run before it is killed.
NOTIFY_TIMEOUT = 30.0


class TipPaymentError(Exception):
    """A tip was not paid; the message is shown to the agent after
    ``<name>: payment not made:`` (``brclient not connected``, ``tip: <brclient's
    error>``, ``tip failed: <attempt error>``)."""


class TipStalledError(TipPaymentError):
    """A tip attempt failed and brclient retries it later (e.g. the payee
    has no wallet: the next attempt is a day away): the wait ends now and
    the agent is told at once, but the tip may still land, so the spend
    stays ``pending`` (counted against the day cap) with this reason in its
    ``err`` until brclient's terminal TipProgress settles it: ``paid`` when
    the retry completes, ``failed`` when brclient will not retry
    (:meth:`Bridge.resolve_spend`; :class:`TipMatcher` routes those events
    past newer payments)."""

    may_land = True


#: Seconds a payment or a PM waits for a clientrpc connection that is down
#: (brclient restarting, the client reconnecting) before it fails.
RECONNECT_WAIT = 30.0


class PatientSender:
    """The bridge's PM sender over a clientrpc :class:`Client`: a PM sent
    while the connection is down waits for it (at most ``wait`` seconds)
    instead of failing at once, so a call made during a reconnect goes
    through. Raises what ``Client.send_pm`` raises."""

    def __init__(self, client: Client, wait: float = RECONNECT_WAIT) -> None:
        self._client = client
        self._wait = wait

    async def send_pm(self, peer: str, text: str) -> None:
        await _await_connection(self._client, self._wait)
        await self._client.send_pm(peer, text)

    async def user_nick(self, uid: str) -> str:
        """brclient's nick for contact ``uid`` (the approvals page); does not
        wait for a reconnect. Raises what :func:`clientrpc_user_nick` raises."""
        return await clientrpc_user_nick(self._client, uid)


async def _await_connection(client: Client, wait: float) -> None:
    """Wait (at most ``wait`` seconds) for a live connection; returns either way."""
    if client.connected or wait <= 0:
        return
    with anyio.move_on_after(wait):
        try:
            await client.wait_connected()
        except ClientrpcNotConnected:
            return


class TipPayer:
    """The daemon's :class:`~brmcp.bridge.Payer`: a Bison Relay tip through
    brclient, confirmed by the terminal tip-progress event that ``matcher``
    pairs with it (payee uid lowercase, amount in milliatoms = atoms * 1000).

    ``pay`` returns once the tip completed and raises
    :class:`TipPaymentError` when brclient refused it or the tip failed for
    good. If the connection drops after ``TipUser`` was sent, the tip may
    have been scheduled: ``pay`` keeps waiting for its outcome (the progress
    stream resumes after the reconnect) until the bridge's tip wait cancels
    it, which leaves the spend pending and counted, never paid twice.

    ``max_attempts``: TipUser's ``maxAttempts`` (≥ 1, else ValueError);
    ``reconnect_wait``: seconds a payment waits for a clientrpc connection
    that is down; ``clock``: times the log line of a slow tip
    (:data:`TIP_SLOW_SECS`; wall time by default, as the tip wait).
    """

    def __init__(
        self,
        client: Client,
        matcher: TipMatcher,
        *,
        max_attempts: int = TIP_MAX_ATTEMPTS,
        reconnect_wait: float = RECONNECT_WAIT,
        clock: Clock | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._reconnect_wait = reconnect_wait
        self._client = client
        self._matcher = matcher
        self._max_attempts = max_attempts

    async def pay(self, payee_uid: str, atoms: int) -> None:
        """Tip ``atoms`` atoms to ``payee_uid`` (64 hex) and wait for the outcome.
        A tip still outstanding after :data:`TIP_SLOW_SECS` s (on the payer's
        clock) is logged once at INFO, saying what it waits for."""
        if atoms <= 0:
            raise TipPaymentError(f"cannot tip {atoms} atoms")
        payee = payee_uid.lower()
        tip = _OutstandingTip(payee, atoms, self._max_attempts)
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._note_slow, tip)
            try:
                await self._pay(tip)
            except Exception as exc:
                # Raised below, as itself (not wrapped in a group).
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def _pay(self, tip: _OutstandingTip) -> None:
        payee, atoms = tip.payee, tip.atoms
        await _await_connection(self._client, self._reconnect_wait)
        if not self._client.connected:
            raise TipPaymentError("brclient not connected")
        waiter = self._matcher.expect(payee, atoms * 1000)
        tip.stage = "taking"
        try:
            try:
                await self._client.tip_user(payee, atoms_to_dcr(atoms), self._max_attempts)
            except ClientrpcNotConnected:
                raise TipPaymentError("brclient not connected") from None
            except RPCError as exc:
                raise TipPaymentError(f"tip: {exc}") from None
            except ClientrpcConnectionLost as exc:
                payment_scheduled()  # it may have been stored: count it as existing
                log.warning(
                    "tip of %d atoms to %s: outcome unknown (%s); waiting for its progress", atoms, payee, exc
                )
            else:
                payment_scheduled()  # stored by brclient: it survives restarts
            tip.stage = "outcome"
            error = await waiter.wait()
        finally:
            waiter.cancel()
        if waiter.stalled:
            raise TipStalledError(
                f"tip cannot complete now: {error}; brclient retries it later, so it may still land"
                " (the spend log records it)"
            )
        if error is not None:
            raise TipPaymentError(f"tip failed: {error}")

    async def _note_slow(self, tip: _OutstandingTip) -> None:
        """Log once what a tip waits for once it is outstanding
        :data:`TIP_SLOW_SECS` s (cancelled when the tip's wait ends)."""
        await self._clock.sleep(TIP_SLOW_SECS)
        log.info("%s", tip.describe(TIP_SLOW_SECS))


class _OutstandingTip:
    """One :meth:`TipPayer.pay` in progress: payee uid (lowercase hex),
    ``atoms``, TipUser's ``maxAttempts``, and how far it got: ``stage`` is
    ``"connecting"`` (waiting for the clientrpc connection), ``"taking"``
    (TipUser sent, not returned) or ``"outcome"`` (brclient took the tip;
    waiting for its terminal TipProgress event)."""

    __slots__ = ("atoms", "max_attempts", "payee", "stage")

    def __init__(self, payee: str, atoms: int, max_attempts: int) -> None:
        self.payee = payee
        self.atoms = atoms
        self.max_attempts = max_attempts
        self.stage = "connecting"

    def describe(self, waited: float) -> str:
        """The log line for a tip outstanding ``waited`` seconds."""
        head = f"tip of {self.atoms} atoms to bot {self.payee}"
        so_far = go_duration(waited)
        if self.stage == "connecting":
            return f"{head}: waiting for the clientrpc connection to brclient ({so_far} so far)"
        if self.stage == "taking":
            return (
                f"{head}: waiting for brclient to take it ({so_far} so far): after brclient starts, its"
                " TipUser waits until its tip restart delay ([tipuser] restartdelay in brclient.conf,"
                " brnet's -tiprestartdelay; 1m0s by default) has passed since it connected to the"
                " relay, so the first paid call after a brclient start can take that long"
            )
        return (
            f"{head}: waiting for brclient to complete it (attempt 1 of {self.max_attempts},"
            f" {so_far} so far): brclient makes one tip at a time to each payee and needs an invoice"
            " from the payee, which must be online; an attempt that fails is retried by brclient after"
            " [tipuser] rerequestinvoicedelay (24h0m0s by default), and this wait then ends with the"
            " spend left pending"
        )


def resolve_listen(address: str) -> str:
    """Validate a loopback ``host:port`` (see
    :func:`~brmcp.bridge.listener.parse_listen_address`) and replace port 0
    with a free port, so the endpoint keeps one address across listener
    restarts and the CLI can find it. Raises ValueError or OSError."""
    host, port = parse_listen_address(address)
    if port == 0:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind(sockaddr)
            port = sock.getsockname()[1]
    shown = host
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            shown = f"[{host}]"
    return f"{shown}:{port}"


def load_daemon_config(datadir: str | os.PathLike[str]) -> tuple[BotConfig, bool]:
    """Create ``datadir`` (mode 0700) when missing and load
    ``<datadir>/brmcp-bridge.conf``, writing bisonbotkit's defaults there when
    it does not exist. Returns ``(config, created)``. Raises
    :class:`~brmcp.clientrpc.ClientrpcConfigError` naming the file, or OSError
    when the directory cannot be created."""
    root = Path(datadir).expanduser()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return load_or_create_bot_config(root, BOT_CONFIG_NAME)


def read_runtime(datadir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The daemon's runtime record (``pid``; ``started``, the process start
    time in clock ticks since boot where the system tells it, else null;
    ``listen``; ``url``; ``sighup``), or None when there is no (readable)
    file. A daemon killed with SIGKILL leaves its record behind: check it
    with :func:`runtime_stale_reason` before trusting it."""
    path = Path(datadir) / RUNTIME_FILE
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError):
        return None
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def runtime_stale_reason(record: Mapping[str, Any]) -> str | None:
    """None when the process a runtime record names still runs (and, where
    the system reports process start times, is the same process that wrote
    the record); otherwise why the record is stale, e.g. ``process 123 is
    gone`` or ``pid 123 now belongs to another process``."""
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return "it names no process"
    if not _pid_alive(pid):
        return f"process {pid} is gone"
    started = record.get("started")
    if isinstance(started, int) and not isinstance(started, bool):
        now = _process_started(pid)
        if now is not None and now != started:
            return f"pid {pid} now belongs to another process"
    return None


def _process_started(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux
    ``/proc/<pid>/stat`` field 22), or None where that is not available."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold anything.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


class BridgeDaemon:
    """A :class:`Bridge` on a brclient, as an async API (``brmcp-bridge`` and
    ``brmcp demo`` run this code).

    ``datadir`` holds the bridge's files; ``client`` is a not yet entered
    :class:`~brmcp.clientrpc.Client` for the user's brclient; ``listen`` the
    endpoint address (loopback; port 0 picks a free port once, see
    :func:`resolve_listen`); ``clock``, ``name`` and ``router_options`` go
    to :class:`BridgeConfig`. Construction loads the settings and spend log
    (raises :class:`BridgeError` naming a malformed file, ValueError for a
    bad address) and opens nothing.

    ``daemon.bridge`` is the :class:`Bridge` (its settings, spend log,
    approvals and admin token); ``daemon.matcher`` the :class:`TipMatcher`;
    :attr:`base_url` the endpoint's ``http://host:port``.
    """

    def __init__(
        self,
        datadir: str | os.PathLike[str],
        client: Client,
        *,
        listen: str = DEFAULT_LISTEN,
        clock: Clock | None = None,
        name: str = "brmcp-bridge",
        router_options: RouterOptions | None = None,
        max_attempts: int = TIP_MAX_ATTEMPTS,
        notify_command: str | None = None,
    ) -> None:
        self.datadir = Path(datadir)
        #: Run on each new payment waiting for approval (see :meth:`_notify`).
        self.notify_command = notify_command or None
        self._notified: set[str] = set()
        #: The Prometheus endpoint (:meth:`enable_metrics`), or None.
        self.metrics_endpoint: MetricsEndpoint | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._unwatch: Callable[[], None] = _nothing
        self.client = client
        self.listen = resolve_listen(listen)
        self.matcher = TipMatcher()
        self.payer = TipPayer(client, self.matcher, max_attempts=max_attempts)
        self.bridge = Bridge(
            BridgeConfig(
                data_dir=self.datadir,
                sender=PatientSender(client),
                payer=self.payer,
                listen=self.listen,
                name=name,
                clock=clock or SystemClock(),
                router_options=router_options or RouterOptions(),
            )
        )
        #: True when :meth:`from_datadir` wrote ``brmcp-bridge.conf`` with defaults.
        self.config_created = False
        #: Terminal tip-progress events that matched no waiting payment.
        self.late_outcomes = 0
        self._ran = False
        self._pm_ack = Acker("PM", client.ack_received_pm)
        self._progress_ack = Acker("tip-progress", client.ack_tip_progress)

    @classmethod
    def from_datadir(
        cls,
        datadir: str | os.PathLike[str],
        *,
        listen: str = DEFAULT_LISTEN,
        clock: Clock | None = None,
        client_options: Mapping[str, Any] | None = None,
        bot_config: BotConfig | None = None,
        config_created: bool = False,
        notify_command: str | None = None,
    ) -> BridgeDaemon:
        """Load ``<datadir>/brmcp-bridge.conf`` (writing bisonbotkit's defaults
        when missing: brclient's files in ``~/.brclient``, clientrpc at
        ``wss://127.0.0.1:7676/ws``), or use ``bot_config`` instead of the
        file (``config_created``: the caller has just written it with
        :func:`load_daemon_config`, which is logged and recorded in
        :attr:`config_created`), and build the daemon. ``client_options`` go to
        :class:`~brmcp.clientrpc.Client`. Raises
        :class:`~brmcp.clientrpc.ClientrpcConfigError` (one line naming the
        file or URL), :class:`BridgeError` or ValueError."""
        root = Path(datadir).expanduser()
        if bot_config is not None:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            cfg, created = bot_config, config_created
        else:
            cfg, created = load_daemon_config(root)
        if created:
            log.warning(
                "wrote %s with defaults (brclient files in %s, clientrpc at %s); edit it if yours differ",
                root / f"{BOT_CONFIG_NAME}.conf",
                Path(cfg.servercertpath).parent,
                cfg.brrpcurl,
            )
        client = Client.from_config(cfg, **dict(client_options or {}))
        command = notify_command if notify_command is not None else cfg.extra.get(NOTIFY_KEY, "")
        daemon = cls(root, client, listen=listen, clock=clock, notify_command=command.strip() or None)
        daemon.config_created = created
        return daemon

    def enable_metrics(self, address: str) -> MetricsEndpoint:
        """Count calls, payments, atoms, errors and waiting approvals in a
        :class:`~brmcp.metrics.BridgeMetrics` and serve them at
        ``http://<address>/metrics`` (loopback only) while :meth:`run` runs.
        Raises ValueError for a bad or non-loopback address."""
        # Imported here: brmcp.metrics uses the bridge's listener module.
        from ..metrics import BridgeMetrics, MetricsEndpoint

        metrics = BridgeMetrics()
        endpoint = MetricsEndpoint(metrics.registry, address)
        self.bridge.use_metrics(metrics)
        self.metrics_endpoint = endpoint
        return endpoint

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the endpoint (served while enabled)."""
        return f"http://{self.listen}"

    @property
    def runtime_path(self) -> Path:
        return self.datadir / RUNTIME_FILE

    async def reload(self) -> Settings:
        """Re-read ``mcpclient.json`` and apply it (what SIGHUP does). Raises
        :class:`BridgeError` for a malformed file, keeping the settings in
        force. When the new settings are in force but the endpoint cannot be
        bound, that is logged as an error and the settings are returned (a
        later reload retries). The bridge logs the endpoint opening or
        closing when ``enabled`` changes."""
        before = self.bridge.settings
        try:
            settings = await self.bridge.reload_settings()
        except BridgeError as exc:
            if self.bridge.settings is before:
                raise
            settings = self.bridge.settings
            log.info("reloaded settings: %s", _describe(settings))
            log.error("the endpoint could not be opened: %s", exc)
            return settings
        log.info("reloaded settings: %s", _describe(settings))
        return settings

    async def run(
        self,
        *,
        handle_signals: bool = False,
        task_status: anyio.abc.TaskStatus[BridgeDaemon] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Connect to brclient, start the bridge and serve until cancelled
        (or, with ``handle_signals``, until SIGINT/SIGTERM; SIGHUP then
        reloads the settings). With ``tg.start(daemon.run)`` the started value
        is the daemon, once the listener (if enabled) is bound and the
        runtime file written; brclient may still be unreachable (the client
        retries with backoff). Raises :class:`BridgeError` when the address
        cannot be bound, another daemon runs on the same data directory, or
        another program consumes the same brclient's events (a second
        bridge or a harness: the one-consumer-per-brclient lock of
        :func:`brmcp._ops.lockfile.acquire_brclient`, taken before any stream
        opens; the error names the holder's pid). Runs once."""
        if self._ran:
            raise RuntimeError("BridgeDaemon.run can be called only once")
        self._ran = True
        self._stopping_at: float | None = None
        with contextlib.ExitStack() as locks:
            locks.enter_context(await anyio.to_thread.run_sync(self._lock_datadir))
            locks.enter_context(await anyio.to_thread.run_sync(self._lock_brclient))
            await self._run(handle_signals, task_status)
        _log_stopped(self._stopping_at)

    def _lock_datadir(self) -> FileLock:
        return acquire_datadir(self.datadir, LOCK_FILE, what="brmcp-bridge", error=BridgeError)

    def _lock_brclient(self) -> FileLock:
        return acquire_brclient(
            self.client.server_cert,
            self.client.url,
            what="brmcp-bridge",
            error=BridgeError,
            client_cert=self.client.client_cert,
            client_key=self.client.client_key,
        )

    async def _run(self, handle_signals: bool, task_status: anyio.abc.TaskStatus[BridgeDaemon]) -> None:
        other = await anyio.to_thread.run_sync(read_runtime, self.datadir)
        if other is not None:
            pid = other.get("pid")
            if pid != os.getpid() and runtime_stale_reason(other) is None:
                raise BridgeError(f"another brmcp-bridge (pid {pid}) is running on {self.datadir}")
        client = self.client
        async with client:
            with connection_signals(client) as connects:
                pms = client.pm_stream()
                progress = client.tip_progress()
                try:
                    await self.bridge.start()
                    async with anyio.create_task_group() as tg:
                        self._tg = tg
                        if self.notify_command:
                            self._unwatch = self.bridge.watch(self._on_change)
                        if self.metrics_endpoint is not None:
                            try:
                                await self.metrics_endpoint.start(tg)
                            except OSError as exc:
                                log.error("metrics endpoint not started: %s", exc)
                            else:
                                log.info("metrics at %s", self.metrics_endpoint.url)
                        if handle_signals:
                            await tg.start(self._signals, tg.cancel_scope)
                        tg.start_soon(self._pm_loop, pms)
                        tg.start_soon(self._progress_loop, progress)
                        tg.start_soon(
                            flush_on_connect,
                            connects,
                            [self._pm_ack, self._progress_ack],
                            self._on_connected,
                            "brclient connect",
                        )
                        await anyio.to_thread.run_sync(self._write_runtime, handle_signals)
                        self._log_state()
                        task_status.started(self)
                finally:
                    self._tg = None
                    self._unwatch()
                    pms.close()
                    progress.close()
                    try:
                        # Not shielded: Bridge.close exits task groups it
                        # entered here, which must be the innermost scopes.
                        await self.bridge.close()
                    finally:
                        with anyio.CancelScope(shield=True):
                            await anyio.to_thread.run_sync(self._remove_runtime)

    def _on_change(self) -> None:
        """A bridge change: start the notification command for each payment
        that has just been parked."""
        pending = self.bridge.pending_payments()
        tg = self._tg
        current = {p.id for p in pending}
        for payment in pending:
            if payment.id not in self._notified and tg is not None:
                tg.start_soon(self._notify, payment)
        self._notified = current

    async def _notify(self, payment: PendingPayment) -> None:
        """Run :attr:`notify_command` (split like a shell line, not run by a
        shell) for one parked payment, with its details in the environment:
        ``BRMCP_PAYMENT_ID``, ``BRMCP_BOT``, ``BRMCP_TOOL``, ``BRMCP_ATOMS``,
        ``BRMCP_APPROVE_COMMAND``. No secret is passed. A command that fails
        or runs longer than :data:`NOTIFY_TIMEOUT` s is logged and killed."""
        command = self.notify_command
        if not command:
            return
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            log.warning("approval notification command %r cannot be parsed: %s", command, exc)
            return
        env = {
            **os.environ,
            "BRMCP_PAYMENT_ID": payment.id,
            "BRMCP_BOT": payment.bot,
            "BRMCP_TOOL": payment.tool,
            "BRMCP_ATOMS": str(payment.atoms),
            "BRMCP_APPROVE_COMMAND": f"brmcp-bridge --datadir {self.datadir} approvals approve {payment.id}",
        }
        try:
            with anyio.fail_after(NOTIFY_TIMEOUT):
                done = await anyio.run_process(argv, env=env, check=False)
        except TimeoutError:
            log.warning("approval notification command %r ran over %.0fs; killed", argv[0], NOTIFY_TIMEOUT)
            return
        except OSError as exc:
            log.warning("approval notification command %r failed to start: %s", argv[0], exc)
            return
        if done.returncode != 0:
            log.warning(
                "approval notification command %r exited with status %d for payment %s",
                argv[0],
                done.returncode,
                payment.id,
            )

    def _log_state(self) -> None:
        settings = self.bridge.settings
        if settings.enabled:
            log.info("settings in force: %s", _describe(settings))
        else:
            log.warning(
                "bridge disabled, no endpoint; to enable: brmcp-bridge --datadir %s %s",
                self.datadir,
                "settings set enabled=true",
            )

    def _write_runtime(self, sighup: bool) -> None:
        pid = os.getpid()
        record = {
            "pid": pid,
            "started": _process_started(pid),
            "listen": self.listen,
            "url": self.base_url,
            "sighup": sighup,
        }
        try:
            write_atomic(self.runtime_path, json.dumps(record) + "\n")
        except OSError as exc:
            log.error("cannot write %s (the CLI will not find this daemon): %s", self.runtime_path, exc)

    def _remove_runtime(self) -> None:
        record = read_runtime(self.datadir)
        if record is not None and record.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                self.runtime_path.unlink()

    async def _on_connected(self) -> None:
        try:
            ident = await self.client.user_public_identity()
        except Exception as exc:
            log.warning("connected to brclient at %s; identity unknown: %s", self.client.url, exc)
            return
        log.info("connected to brclient at %s as %s (uid %s)", self.client.url, ident.nick, ident.uid)
        if ident.uid:
            self.bridge.set_own_uid(ident.uid)

    async def _pm_loop(self, pms: Subscription[ReceivedPM]) -> None:
        async for pm in pms:
            try:
                self.bridge.handle_pm(pm.uid, pm.message)
            except Exception:
                log.exception("PM %d from %s could not be handed to the bridge", pm.sequence_id, pm.uid)
            await self._pm_ack.ack(pm.sequence_id)

    async def _progress_loop(self, progress: Subscription[TipProgressEvent]) -> None:
        async for event in progress:
            if await self._on_progress(event):
                await self._progress_ack.ack(event.sequence_id)

    async def _on_progress(self, event: TipProgressEvent) -> bool:
        """Handle one tip-progress event; False when it must not be acked yet."""
        if not event.final:
            log.info(
                "tip of %d matoms to %s: attempt %d failed (%s); brclient retries",
                event.amount_matoms,
                event.uid,
                event.attempt,
                event.attempt_err,
            )
            # The attempt cannot complete now: the payment waiting for it
            # ends at once (its spend stays pending: it may still land). A
            # further retried attempt of a stalled tip changes nothing.
            self.matcher.stall(event.uid, event.amount_matoms, event.attempt_err)
            return True
        error = None if event.completed else (event.attempt_err or "tip attempt failed")
        written = anyio.Event()
        unwatch = self.bridge.watch(written.set)
        try:
            if self.matcher.resolve(event.uid, event.amount_matoms, error):
                # The payment waiting for this outcome writes it to the spend
                # log; the event is acked only after that write (or a bounded
                # wait), so a crash in between leaves it to be replayed and
                # the entry is never left pending for a tip that completed.
                with anyio.move_on_after(OUTCOME_WRITE_WAIT):
                    await written.wait()
                return True
        finally:
            unwatch()
        self.late_outcomes += 1
        try:
            settled = await self.bridge.resolve_spend(event.uid, event.amount_matoms // 1000, error)
        except BridgeError as exc:
            log.error("late tip outcome for %s not recorded: %s", event.uid, exc)
            return False
        if settled:
            log.info(
                "late tip outcome recorded: %d matoms to %s %s",
                event.amount_matoms,
                event.uid,
                "paid" if error is None else f"failed ({error})",
            )
        return True

    async def _signals(
        self, scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    try:
                        await self.reload()
                    except BridgeError as exc:
                        log.error("reload refused, keeping the previous settings: %s", exc)
                    continue
                log.info("%s: stopping", signal.Signals(signum).name)
                self._stopping_at = anyio.current_time()
                scope.cancel()
                return


def _nothing() -> None:
    return None


def _describe(settings: Settings) -> str:
    bots = len(settings.allowed_bots or ())
    return (
        f"enabled={str(settings.enabled).lower()} mode={settings.mode} "
        f"per_call_cap_atoms={settings.per_call_cap_atoms} per_day_cap_atoms={settings.per_day_cap_atoms} "
        f"allowed_bots={bots} prepay_bots={len(settings.prepay_bots or ())}"
    )


def _log_stopped(since: float | None) -> None:
    """The last line of a stop a signal asked for, with how long it took."""
    if since is not None:
        log.info("stopped (%.1f s after the signal)", anyio.current_time() - since)
