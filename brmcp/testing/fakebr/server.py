"""A fake brclient: the clientrpc JSON-RPC server on loopback over mutual TLS,
faithful on the wire (every rule of docs/clientrpc.md), backed by a :class:`FakeRelay`.

What it reproduces:

* TLS: Ed25519 certificates laid out like brclient's (:mod:`.certs`), a client
  certificate chaining to ``rpc-ca.cert`` is required; optional Basic auth with
  the 401/403 texts of docs/clientrpc.md §Basic auth (checked before the websocket upgrade); the gorilla
  Origin check, quirks included.
* ``/ws`` is the websocket; every other path is the plain POST JSON-RPC
  endpoint (responses as JSON lines; the no-auth wrapper bug appends its text).
* Output: one binary message per JSON-RPC message, compact Go-style JSON plus
  ``\\n``, key order ``jsonrpc, id, params, result, error, method``; pongs
  always carry 16 bytes (the ping payload zero-padded or truncated); a ping of
  16 random bytes every ``ping_interval`` seconds, the connection dropped when
  no identical pong comes within ``ping_timeout``.
* Input: the first JSON value of each message; malformed JSON, a non-object
  (batches included) or ``jsonrpc`` other than ``"2.0"`` closes the
  connection without a reply; envelope keys match case-insensitively; client
  notifications and responses are ignored.
* Requests: a ``Svc.Method[digits]`` suffix is stripped (decimal only);
  unknown service/method are -32603 ``unknown service``/``unknown method``;
  params go through strict protojson (-32602 ``unable to decode params: ...``);
  handler errors are -32603 with brclient's texts; at most 16 requests in
  flight per connection, streams counting for their lifetime, and the reader
  stalls (no pongs either) while all 16 are taken.
* Streams (PM, tips received, tip progress): a per-type replay log with
  ``(file << 32) | offset`` ids; opening replays ids > ``unackedFrom`` and then
  registers for live events, atomically; every open stream of a type gets every
  event; acks are global and destructive; events are logged even when no
  client is connected; no response ever, except the final error that ends a
  stream (10000 ``EOF`` or another error, sent only by :meth:`FakeBRClient.end_streams`
  or a failing replay).

Real-client behaviour (proven against brnet by :mod:`brmcp.testing.compare`):
amounts rounded to whole atoms, relay timestamps in whole seconds, the PM size
limit after compression (and the recipient's silent drop of a compressible PM
too large once inflated), tips to one payee one at a time, a PM call from a
user off the relay waiting until it is back, ``wallet=False`` as brclient's
no-wallet payment client, replay logs kept on disk across restarts (ids keep
growing), and brclient's error texts in its order of checks. Speed options,
off by default: ``pm_pacing`` and ``tip_restart_delay``.

Control hooks for tests: :meth:`~FakeBRClient.drop_connections`,
:meth:`~FakeBRClient.send_raw`, :meth:`~FakeBRClient.send_notification`,
:meth:`~FakeBRClient.end_streams`, :meth:`~FakeBRClient.ping`,
:meth:`~FakeBRClient.pause_reading`, :meth:`~FakeBRClient.hold`,
:meth:`~FakeBRClient.fail_next_tip`, the ``emit_*`` injectors, and counters.

Layout: this module holds the fake's lifecycle, addresses, config output,
test state and control hooks; its other parts are mixins, one concept per
module, over the shared state of ``_state``: ``_events`` (replay logs and
the ``emit_*`` injectors), ``_handlers`` (the unary methods and brclient's
checks), ``_session`` (one websocket connection's loops, requests and
streams) and ``_http`` (Basic auth, the ``/ws`` upgrade, the POST endpoint).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ...clientrpc.client import Client
from ...clientrpc.config import BotConfig
from ...clientrpc.types import (
    ReceivedPM,
    ReceivedTip,
    TipProgressEvent,
    VersionResponse,
)
from ._conn import _Conn, _Stream
from ._http import _HTTP
from ._protocol import (
    _STREAMS,
    CODE_EOF,
    CODE_INTERNAL,
    CODE_INVALID_PARAMS,
    KIND_PM,
    KIND_TIP_PROGRESS,
    KIND_TIP_RECEIVED,
    RPCFault,
)
from .certs import BRClientCerts, ensure_brclient_certs
from .relay import FakeRelay, TipFailure
from .replaylog import ReplayLog

__all__ = [
    "CODE_EOF",
    "CODE_INTERNAL",
    "CODE_INVALID_PARAMS",
    "KIND_PM",
    "KIND_TIP_PROGRESS",
    "KIND_TIP_RECEIVED",
    "FakeBRClient",
    "RPCFault",
]

log = logging.getLogger("brmcp.testing.fakebr")


class FakeBRClient(_HTTP):
    """One fake brclient: a BR user on the :class:`FakeRelay` plus its clientrpc server.

    ``nick``: the user's nick (and ``name``, default the nick); ``root``: its
    brclient directory (certificates are created there when missing, and
    :meth:`write_brclient_conf` writes ``brclient.conf``); ``uid``: 64 hex
    (random by default). ``host``/``port``: the listener (port 0 picks one).
    ``auth_mode``/``rpcuser``/``rpcpass``: brclient's ``rpcauthmode`` (any
    non-empty value turns Basic auth on) and credentials.
    ``require_client_cert``: False models an empty ``rpcclientcapath``.
    ``ping_interval``/``ping_timeout``: the server's keepalive in seconds
    (None disables it). ``allow_remote_send_tip``/``max_remote_send_tip_amt``
    (DCR, <= 0: no cap): brclient's guards on ``TipUser``. ``wallet``: False is
    brclient's ``wallettype = disabled`` (tips to this user never complete).
    ``pm_pacing`` (seconds, 0 = off; a real brclient ≈ 0.1) and
    ``tip_restart_delay`` (seconds, 0 = off; brclient 60): the speed options.

    Use as ``async with FakeBRClient(relay, "bot", path) as br:``; while it runs
    the user is online on the relay, otherwise offline (PMs and tips wait).
    """

    def __init__(
        self,
        relay: FakeRelay,
        nick: str,
        root: str | os.PathLike[str],
        *,
        uid: str | None = None,
        name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        auth_mode: str = "",
        rpcuser: str = "",
        rpcpass: str = "",
        require_client_cert: bool = True,
        ping_interval: float | None = 30.0,
        ping_timeout: float = 10.0,
        allow_remote_send_tip: bool = True,
        max_remote_send_tip_amt: float = -1.0,
        app_version: str = "0.2.4",
        go_runtime: str = "go1.23.4",
        max_in_flight: int = 16,
        wallet: bool = True,
        pm_pacing: float = 0.0,
        tip_restart_delay: float = 0.0,
    ) -> None:
        self.relay = relay
        self.nick = nick
        self.name = name if name is not None else nick
        self.root = Path(root)
        self.host = host
        self.port = port
        self.auth_mode = auth_mode
        self.rpcuser = rpcuser
        self.rpcpass = rpcpass
        self.require_client_cert = require_client_cert
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.allow_remote_send_tip = allow_remote_send_tip
        self.max_remote_send_tip_amt = max_remote_send_tip_amt
        self.version = VersionResponse(app_version=app_version, go_runtime=go_runtime, app_name="brclient")
        self.max_in_flight = max_in_flight
        #: False models brclient's ``[payment] wallettype = disabled``: tips to
        #: this user never complete (it reports a 0-matoms tip at once).
        self.wallet = wallet
        #: Speed option (0 = off): seconds between back-to-back PMs in one
        #: direction, and the time one tip takes; a real brclient batches its
        #: rendezvous subscriptions every 0.1 s.
        self.pm_pacing = pm_pacing
        #: Speed option (0 = off): ``TipUser`` blocks until this many seconds
        #: after the fake started (brclient's ``tipuser.restartdelay``, 60 s).
        self.tip_restart_delay = tip_restart_delay
        self._started_at = 0.0
        self.sig_key = (
            Ed25519PrivateKey.generate()
            .public_key()
            .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )
        self.uid = relay._register(self, uid)
        self.certs = BRClientCerts(self.root)
        # Replay logs and open streams, by kind.
        self.logs: dict[str, ReplayLog[Any]] = {k: ReplayLog(k) for k in _STREAMS.values()}
        self._load_logs()
        self._streams: dict[str, list[_Stream]] = {k: [] for k in _STREAMS.values()}
        self._conns: list[_Conn] = []
        self._serial = 0
        self._runner: web.AppRunner | None = None
        self._change: anyio.Event | None = None
        self._paused: anyio.Event | None = None
        self._holds: dict[str, anyio.Event] = {}
        self._tip_failures: list[TipFailure] = []
        #: Every request the fake accepted: ``(method as sent, params as a plain value)``.
        self.requests: list[tuple[str, Any]] = []
        #: Every websocket data message received, as bytes.
        self.frames_in: list[bytes] = []
        #: Headers of every request to ``/ws`` (before auth and upgrade).
        self.upgrade_headers: list[dict[str, str]] = []
        #: Payloads of the pings clients sent (each answered with a 16-byte pong).
        self.pings_received: list[bytes] = []
        #: Connections accepted so far.
        self.total_connections = 0
        #: The most requests seen in flight on one connection.
        self.max_in_flight_seen = 0

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> FakeBRClient:
        self._change = anyio.Event()
        self.certs = await anyio.to_thread.run_sync(ensure_brclient_certs, self.root)
        ctx = self.certs.server_ssl_context(require_client_cert=self.require_client_cert)
        app = web.Application()
        app.router.add_route("*", "/ws", self._ws_handler)
        app.router.add_route("*", "/{tail:.*}", self._post_handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            await runner.cleanup()
            raise
        self.port = sock.getsockname()[1]
        site = web.SockSite(runner, sock, ssl_context=ctx)
        await site.start()
        self._runner = runner
        self._started_at = time.monotonic()
        self.relay.set_online(self.uid)
        log.info("fakebr: %s (%s) serving clientrpc on %s", self.nick, self.uid[:16], self.url)
        return self

    #: Where the replay logs persist between runs on the same root.
    LOGS_FILE = "fakebr-replaylogs.json"

    def _load_logs(self) -> None:
        """Reload the replay logs a previous fake on this root and uid left
        (brclient's logs live on disk: ids keep growing across restarts)."""
        try:
            saved = json.loads((self.root / self.LOGS_FILE).read_text())
        except (OSError, ValueError):
            return
        if not isinstance(saved, dict) or saved.get("uid") != self.uid:
            return
        decoders: dict[str, Callable[[Any], Any]] = {
            KIND_PM: ReceivedPM.from_wire,
            KIND_TIP_RECEIVED: ReceivedTip.from_wire,
            KIND_TIP_PROGRESS: TipProgressEvent.from_wire,
        }
        for kind, log_state in (saved.get("logs") or {}).items():
            decode = decoders.get(kind)
            if decode is None:
                continue
            try:
                self.logs[kind].restore(log_state, _by_value(decode))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("fakebr: %s: ignoring saved %s replay log: %s", self.nick, kind, exc)

    def _save_logs(self) -> None:
        state = {
            "uid": self.uid,
            "logs": {kind: rl.state(lambda ev: ev.to_wire()) for kind, rl in self.logs.items()},
        }
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / self.LOGS_FILE).write_text(json.dumps(state))
        except OSError as exc:
            log.warning("fakebr: %s: cannot save the replay logs: %s", self.nick, exc)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.relay.set_offline(self.uid)
        self.drop_connections()
        self._save_logs()
        runner, self._runner = self._runner, None
        if runner is not None:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()

    @property
    def url(self) -> str:
        """``wss://host:port/ws``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"wss://{host}:{self.port}/ws"

    @property
    def listen(self) -> str:
        """The ``jsonrpclisten`` value (``host:port``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def bot_config(self, datadir: str | os.PathLike[str], name: str = "brmcp-serve") -> BotConfig:
        """A bisonbotkit bot config pointing at this fake (Basic-auth credentials
        are this fake's when set, else random as bisonbotkit's defaults)."""
        cfg = BotConfig.defaults(datadir, name)
        cfg.brrpcurl = self.url
        cfg.servercertpath = str(self.certs.server_cert)
        cfg.clientcertpath = str(self.certs.client_cert)
        cfg.clientkeypath = str(self.certs.client_key)
        if self.rpcuser or self.rpcpass:
            cfg.rpcuser, cfg.rpcpass = self.rpcuser, self.rpcpass
        return cfg

    def client(self, **kwargs: Any) -> Client:
        """A :class:`~brmcp.clientrpc.Client` for this fake (with its credentials);
        ``kwargs`` go to the constructor."""
        kwargs.setdefault("rpcuser", self.rpcuser)
        kwargs.setdefault("rpcpass", self.rpcpass)
        return Client(
            self.url,
            server_cert=self.certs.server_cert,
            client_cert=self.certs.client_cert,
            client_key=self.certs.client_key,
            **kwargs,
        )

    def brclient_conf(self) -> str:
        """The ``brclient.conf`` text for this fake (``[default] root`` and the
        ``[clientrpc]`` section of docs/clientrpc.md §brclient.conf)."""
        lines = [
            "[default]",
            f"root = {self.root}",
            "",
            "[clientrpc]",
            f"jsonrpclisten = {self.listen}",
            f"rpccertpath = {self.certs.server_cert}",
            f"rpckeypath = {self.certs.server_key}",
            f"rpcclientcapath = {self.certs.ca_cert if self.require_client_cert else ''}",
            "rpcissueclientcert = true",
        ]
        if self.auth_mode:
            lines += [
                f"rpcauthmode = {self.auth_mode}",
                f"rpcuser = {self.rpcuser}",
                f"rpcpass = {self.rpcpass}",
            ]
        if not self.allow_remote_send_tip:
            lines.append("rpcallowremotesendtip = false")
        if self.max_remote_send_tip_amt > 0:
            lines.append(f"rpcmaxremotesendtipamt = {self.max_remote_send_tip_amt}")
        return "\n".join(lines) + "\n"

    def write_brclient_conf(self) -> Path:
        """Write :meth:`brclient_conf` to ``<root>/brclient.conf`` (mode 0600)."""
        path = self.root / "brclient.conf"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(self.brclient_conf())
        return path

    # -- state for tests -----------------------------------------------------------------

    @property
    def connection_count(self) -> int:
        """Websocket connections open now."""
        return len(self._conns)

    def stream_count(self, kind: str) -> int:
        """Open streams of ``kind`` (``KIND_PM``, ``KIND_TIP_RECEIVED``, ``KIND_TIP_PROGRESS``)."""
        return len(self._streams[kind])

    def stream_methods(self, kind: str) -> list[str]:
        """The exact method strings (suffix included) of the open streams of ``kind``."""
        return [s.method for s in self._streams[kind]]

    def in_flight(self) -> list[int]:
        """Requests in flight (streams included) per open connection."""
        return [c.in_flight for c in self._conns]

    def pending_events(self, kind: str) -> list[Any]:
        """Events of ``kind`` still in the replay log (not acked), oldest first."""
        return list(self.logs[kind])

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` is true; it is re-checked whenever the fake's
        state changes (connections, streams, requests, events). Bound it with
        ``anyio.fail_after``."""
        while not predicate():
            if self._change is None:
                raise RuntimeError("FakeBRClient is not running")
            await self._change.wait()

    async def wait_connections(self, count: int) -> None:
        await self.wait_for(lambda: len(self._conns) >= count)

    async def wait_streams(self, kind: str, count: int) -> None:
        await self.wait_for(lambda: len(self._streams[kind]) >= count)

    # -- control hooks -------------------------------------------------------------------

    def drop_connections(self) -> None:
        """Abort every websocket connection (TCP close, no close frame)."""
        for conn in list(self._conns):
            conn.abort("dropped by the test")

    def send_raw(self, data: bytes | str) -> None:
        """Send ``data`` as one message on every connection (binary for bytes,
        text for str), in order with the fake's other output."""
        payload = data.encode("utf-8") if isinstance(data, str) else data
        for conn in self._conns:
            conn.enqueue(payload)

    def send_notification(self, method: str, params: Mapping[str, Any]) -> None:
        """Send a notification with any method string on every connection."""
        for conn in self._conns:
            conn.notify(method, params)

    def end_streams(self, kind: str | None = None, *, code: int = CODE_EOF, message: str = "EOF") -> int:
        """End the open streams (of ``kind``, or all) with an error response to
        their opening id (10000 ``EOF`` = clean end). Returns how many ended."""
        ended = 0
        for k, streams in self._streams.items():
            if kind is not None and k != kind:
                continue
            for stream in list(streams):
                stream.end = (code, message)
                stream.ended.set()
                ended += 1
        return ended

    async def ping(self, payload: bytes) -> list[bytes]:
        """Ping every connection with ``payload`` (any length) and return the pong
        payloads that match it, one per connection that answered. Bound it with
        ``anyio.fail_after``."""
        answered: list[bytes] = []
        for conn in list(self._conns):
            got = conn.test_pings[payload] = anyio.Event()
            await conn.ws.ping(payload)
            await got.wait()
            answered.append(payload)
        return answered

    def pause_reading(self) -> None:
        """Stop reading from every connection (requests, acks and pongs stall)."""
        if self._paused is None:
            self._paused = anyio.Event()

    def resume_reading(self) -> None:
        paused, self._paused = self._paused, None
        if paused is not None:
            paused.set()

    def hold(self, method: str) -> None:
        """Make unary ``method`` (``Service.Method``) block until :meth:`release`."""
        self._holds.setdefault(method, anyio.Event())

    def release(self, method: str) -> None:
        gate = self._holds.pop(method, None)
        if gate is not None:
            gate.set()

    def fail_next_tip(self, failure: TipFailure | None = None) -> None:
        """Apply ``failure`` (default: one failed attempt that will be retried) to
        the next ``TipUser`` call; calls queue up in order."""
        self._tip_failures.append(failure or TipFailure())


def _by_value(decode: Callable[[Any], Any]) -> Callable[[Any, int], Any]:
    """A :meth:`ReplayLog.restore` decoder that needs only the stored value."""

    def restore(value: Any, _seq: int) -> Any:
        return decode(value)

    return restore
