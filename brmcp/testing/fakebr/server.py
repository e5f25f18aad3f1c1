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

Key exchange: ``MediateKX``, ``KXStream`` and ``AckKXCompleted`` over
clientrpc (the relay carries the mediated KX: :mod:`.relay`); with
``status_server=True`` a brclientd-style status server on a second port
(:attr:`FakeBRClient.status_url`, :mod:`._status`) takes KX suggestions,
which reach the invitee's fake as :attr:`FakeBRClient.kx_suggestions`
(accepted with :meth:`FakeBRClient.accept_kx_suggestion`, or at once with
``auto_accept_kx_suggestions``).

Control hooks for tests: :meth:`~FakeBRClient.drop_connections`,
:meth:`~FakeBRClient.send_raw`, :meth:`~FakeBRClient.send_notification`,
:meth:`~FakeBRClient.end_streams`, :meth:`~FakeBRClient.ping`,
:meth:`~FakeBRClient.pause_reading`, :meth:`~FakeBRClient.hold`,
:meth:`~FakeBRClient.fail_next_tip`, the ``emit_*`` injectors, and counters.

Layout: :class:`FakeBRClient` owns its lifecycle, addresses, config output,
test state and control hooks, and composes its parts, one concept per
module, each given what it depends on: ``_state`` (the settings played, the
record tests read, the change signal, the test switches), ``_events`` (replay
logs, open streams, the ``emit_*`` injectors, persistence), ``_handlers``
(the unary methods and brclient's checks), ``_session`` (each websocket
connection's loops, requests and streams) and ``_http`` (Basic auth, the
``/ws`` upgrade, the POST endpoint, the open connections); ``_parts`` has
the descriptor forwarding the client's knobs to those parts and ``_listen``
the TLS listeners.
"""

from __future__ import annotations

import logging
import os
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
    KXCompleted,
    PublicIdentity,
    ReceivedPM,
    ReceivedTip,
    TipProgressEvent,
    VersionResponse,
)
from ._events import LOGS_FILE, EventLog
from ._handlers import MethodTable
from ._http import HTTPFront
from ._listen import serve_tls
from ._parts import In
from ._protocol import (
    CODE_EOF,
    CODE_INTERNAL,
    CODE_INVALID_PARAMS,
    KIND_KX,
    KIND_PM,
    KIND_TIP_PROGRESS,
    KIND_TIP_RECEIVED,
    RPCFault,
)
from ._session import Sessions
from ._state import Changes, Controls, Record, Settings
from ._status import StatusServer
from .certs import BRClientCerts, ensure_brclient_certs
from .relay import FakeRelay, KXSuggestion, Mediation, TipFailure
from .replaylog import ReplayLog

__all__ = [
    "CODE_EOF",
    "CODE_INTERNAL",
    "CODE_INVALID_PARAMS",
    "KIND_KX",
    "KIND_PM",
    "KIND_TIP_PROGRESS",
    "KIND_TIP_RECEIVED",
    "FakeBRClient",
    "RPCFault",
]

log = logging.getLogger("brmcp.testing.fakebr")


class FakeBRClient:
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
    ``status_server``: also serve brclientd's status server (KX suggestions)
    on ``status_port`` (0 picks one); ``auto_accept_kx_suggestions``: accept
    every KX suggestion received at once (a mediated KX through its sender).

    Use as ``async with FakeBRClient(relay, "bot", path) as br:``; while it runs
    the user is online on the relay, otherwise offline (PMs and tips wait).
    """

    # The brclient played, kept in its settings part (every part reads them live).
    nick = In[str]("_settings")
    name = In[str]("_settings")
    uid = In[str]("_settings")
    sig_key = In[bytes]("_settings")
    version = In[VersionResponse]("_settings")
    auth_mode = In[str]("_settings")
    rpcuser = In[str]("_settings")
    rpcpass = In[str]("_settings")
    ping_interval = In[float | None]("_settings")
    ping_timeout = In[float]("_settings")
    allow_remote_send_tip = In[bool]("_settings")
    max_remote_send_tip_amt = In[float]("_settings")
    max_in_flight = In[int]("_settings")
    #: Speed option (0 = off): seconds between the deliveries of
    #: back-to-back PMs in one direction (the ``PM`` call still returns at
    #: once; :meth:`FakeRelay.send_pm`), and the time one tip takes; a real
    #: brclient batches its rendezvous subscriptions every 0.1 s.
    pm_pacing = In[float]("_settings")
    #: Speed option (0 = off): ``TipUser`` blocks until this many seconds
    #: after the fake started (brclient's ``tipuser.restartdelay``, 60 s).
    tip_restart_delay = In[float]("_settings")
    # What it observed, kept in its record part.
    #: Every request the fake accepted: ``(method as sent, params as a plain value)``.
    requests = In[list[tuple[str, Any]]]("_record")
    #: Every websocket data message received, as bytes.
    frames_in = In[list[bytes]]("_record")
    #: Headers of every request to ``/ws`` (before auth and upgrade).
    upgrade_headers = In[list[dict[str, str]]]("_record")
    #: Payloads of the pings clients sent (each answered with a 16-byte pong).
    pings_received = In[list[bytes]]("_record")
    #: Keepalive round trips completed (an identical pong to the fake's own ping).
    keepalive_pongs = In[int]("_record")
    #: Connections accepted so far.
    total_connections = In[int]("_record")
    #: The most requests seen in flight on one connection.
    max_in_flight_seen = In[int]("_record")
    #: The replay logs by kind (``KIND_PM``, ``KIND_TIP_RECEIVED``, ``KIND_TIP_PROGRESS``, ``KIND_KX``).
    logs = In[dict[str, ReplayLog[Any]]]("_events")

    #: Where the replay logs persist between runs on the same root.
    LOGS_FILE = LOGS_FILE

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
        status_server: bool = False,
        status_port: int = 0,
        auto_accept_kx_suggestions: bool = False,
    ) -> None:
        self.relay = relay
        self.root = Path(root)
        self.host = host
        self.port = port
        self.require_client_cert = require_client_cert
        #: False models brclient's ``[payment] wallettype = disabled``: tips to
        #: this user never complete (it reports a 0-matoms tip at once).
        self.wallet = wallet
        self._settings = Settings(
            nick=nick,
            name=name if name is not None else nick,
            sig_key=Ed25519PrivateKey.generate()
            .public_key()
            .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw),
            version=VersionResponse(app_version=app_version, go_runtime=go_runtime, app_name="brclient"),
            auth_mode=auth_mode,
            rpcuser=rpcuser,
            rpcpass=rpcpass,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            allow_remote_send_tip=allow_remote_send_tip,
            max_remote_send_tip_amt=max_remote_send_tip_amt,
            max_in_flight=max_in_flight,
            pm_pacing=pm_pacing,
            tip_restart_delay=tip_restart_delay,
        )
        self._settings.uid = relay._register(self, uid)
        self.certs = BRClientCerts(self.root)
        self._record = Record()
        self._changes = Changes()
        self._controls = Controls()
        self._events = EventLog(self._settings, self._changes, relay.nicks)
        self._events.load(self.root)
        self._methods = MethodTable(self._settings, relay, self._events, self._controls, member=self)
        sessions = Sessions(
            self._settings, self._record, self._changes, self._controls, self._events, self._methods
        )
        self._http = HTTPFront(
            self._settings, self._record, self._changes, self._events, self._methods, sessions
        )
        self._runner: web.AppRunner | None = None
        self.status_server = status_server
        self.status_port = status_port
        #: Accept every KX suggestion on arrival (:meth:`accept_kx_suggestion`).
        self.auto_accept_kx_suggestions = auto_accept_kx_suggestions
        #: KX suggestions received and neither accepted nor declined, oldest first.
        self.kx_suggestions: list[KXSuggestion] = []
        #: Every status-server answer about a suggestion: ``(HTTP status,
        #: {"invitee", "target"} as sent, or None for an unreadable body)``.
        self.status_requests: list[tuple[int, dict[str, str] | None]] = []
        self._status = StatusServer(
            self._settings,
            relay,
            self._changes,
            lambda status, fields: self.status_requests.append((status, fields)),
        )
        self._status_runner: web.AppRunner | None = None

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> FakeBRClient:
        self._changes.start()
        self.certs = await anyio.to_thread.run_sync(ensure_brclient_certs, self.root)
        ctx = self.certs.server_ssl_context(require_client_cert=self.require_client_cert)
        app = web.Application()
        self._http.routes(app)
        self._runner, self.port = await serve_tls(app, self.host, self.port, ctx)
        if self.status_server:
            status_app = web.Application()
            self._status.routes(status_app)
            try:
                self._status_runner, self.status_port = await serve_tls(
                    status_app, self.host, self.status_port, ctx
                )
            except BaseException:
                runner, self._runner = self._runner, None
                with anyio.CancelScope(shield=True):
                    await runner.cleanup()
                raise
        self._methods.mark_started()
        self.relay.set_online(self.uid)
        log.info("fakebr: %s (%s) serving clientrpc on %s", self.nick, self.uid[:16], self.url)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.relay.set_offline(self.uid)
        self.drop_connections()
        self._events.save(self.root)
        for runner in (self._status_runner, self._runner):
            if runner is not None:
                with anyio.CancelScope(shield=True):
                    await runner.cleanup()
        self._runner = self._status_runner = None

    # -- the relay's side -------------------------------------------------------------

    def public_identity(self) -> PublicIdentity:
        """This user's ``UserPublicIdentity`` (name, nick, signature key, uid)."""
        return self._methods.public_identity()

    def emit_pm(
        self,
        from_uid: str,
        message: str,
        *,
        nick: str | None = None,
        timestamp_ms: int | None = None,
        mode: str = "MESSAGE_MODE_NORMAL",
    ) -> ReceivedPM:
        """Log a received PM (as if it came from ``from_uid``) and broadcast
        it; ``nick`` defaults to the sender's on the relay, ``timestamp_ms``
        to now (unix milliseconds)."""
        return self._events.emit_pm(from_uid, message, nick=nick, timestamp_ms=timestamp_ms, mode=mode)

    def emit_received_tip(
        self, from_uid: str, amount_matoms: int, *, sequence_id: int | None = None
    ) -> ReceivedTip:
        """Log a received tip (milliatoms) and broadcast it. ``sequence_id``
        overrides the id the log would give it (hostile-brclient tests)."""
        return self._events.emit_received_tip(from_uid, amount_matoms, sequence_id=sequence_id)

    def emit_tip_progress(
        self,
        to_uid: str,
        amount_matoms: int,
        *,
        nick: str | None = None,
        completed: bool = False,
        attempt: int = 0,
        attempt_err: str = "",
        will_retry: bool = False,
    ) -> TipProgressEvent:
        """Log a tip-progress event for a tip to ``to_uid`` (milliatoms) and broadcast it."""
        return self._events.emit_tip_progress(
            to_uid,
            amount_matoms,
            nick=nick,
            completed=completed,
            attempt=attempt,
            attempt_err=attempt_err,
            will_retry=will_retry,
        )

    def _receive_pm(self, from_uid: str, text: str, timestamp_ms: int) -> None:
        """The relay delivers a PM (:class:`~.relay.RelayMember`)."""
        self._events.receive_pm(from_uid, text, timestamp_ms)

    def emit_kx_completed(
        self, uid: str, *, nick: str | None = None, initial_rendezvous: bytes = b""
    ) -> KXCompleted:
        """Log a completed KX with ``uid`` and broadcast it on the KX streams
        (``nick`` defaults to that user's on the relay). It does not make
        contacts: :meth:`FakeRelay.complete_kx` does both."""
        return self._events.emit_kx_completed(uid, nick=nick, initial_rendezvous=initial_rendezvous)

    # -- key exchange ------------------------------------------------------------------

    def _receive_kx_suggestion(self, suggestion: KXSuggestion) -> None:
        """The relay delivers a KX suggestion (:class:`~.relay.RelayMember`)."""
        self.kx_suggestions.append(suggestion)
        self._changes.changed()
        if self.auto_accept_kx_suggestions:
            try:
                self.accept_kx_suggestion(suggestion)
            except RPCFault as fault:
                log.info("fakebr: %s could not accept a KX suggestion: %s", self.nick, fault.message)

    def accept_kx_suggestion(self, suggestion: KXSuggestion) -> Mediation:
        """Accept ``suggestion`` as brclient does: a mediated KX with its
        target through its sender (``ChatService.MediateKX``'s checks and
        :class:`RPCFault` texts; the suggestion is removed first, as
        brclient removes it when it asks). Returns the relay's
        :class:`~.relay.Mediation`."""
        if suggestion in self.kx_suggestions:
            self.kx_suggestions.remove(suggestion)
        return self._methods.mediate_kx(suggestion.suggester, suggestion.target)

    def decline_kx_suggestion(self, suggestion: KXSuggestion) -> None:
        """Forget ``suggestion`` (brclient's ``DeclineKXSuggestion``)."""
        if suggestion in self.kx_suggestions:
            self.kx_suggestions.remove(suggestion)
        self._changes.changed()

    def fail_next_suggestion(self, status: int, body: str = "") -> None:
        """Have the status server answer the next suggestion with HTTP
        ``status`` and the text ``body`` (nothing is suggested); calls queue up."""
        self._status.fail_next(status, body)

    @property
    def status_url(self) -> str:
        """The status server's base URL, ``https://host:port`` (``""`` when
        ``status_server`` is off or before the fake started)."""
        if not self.status_server or not self.status_port:
            return ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.status_port}"

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
        cfg.brstatusurl = self.status_url
        return cfg

    def client(self, **kwargs: Any) -> Client:
        """A :class:`~brmcp.clientrpc.Client` for this fake (with its credentials);
        ``kwargs`` go to the constructor."""
        kwargs.setdefault("rpcuser", self.rpcuser)
        kwargs.setdefault("rpcpass", self.rpcpass)
        kwargs.setdefault("status_url", self.status_url)
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
        return len(self._http.conns)

    def stream_count(self, kind: str) -> int:
        """Open streams of ``kind`` (``KIND_PM``, ``KIND_TIP_RECEIVED``,
        ``KIND_TIP_PROGRESS``, ``KIND_KX``)."""
        return len(self._events.streams(kind))

    def stream_methods(self, kind: str) -> list[str]:
        """The exact method strings (suffix included) of the open streams of ``kind``."""
        return [s.method for s in self._events.streams(kind)]

    def in_flight(self) -> list[int]:
        """Requests in flight (streams included) per open connection."""
        return [c.in_flight for c in self._http.conns]

    def pending_events(self, kind: str) -> list[Any]:
        """Events of ``kind`` still in the replay log (not acked), oldest first."""
        return list(self.logs[kind])

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` is true; it is re-checked whenever the fake's
        state changes (connections, streams, requests, events). Bound it with
        ``anyio.fail_after``; RuntimeError when the fake is not running."""
        await self._changes.wait_for(predicate)

    async def wait_connections(self, count: int) -> None:
        """Wait until at least ``count`` websocket connections are open."""
        await self.wait_for(lambda: self.connection_count >= count)

    async def wait_streams(self, kind: str, count: int) -> None:
        """Wait until at least ``count`` streams of ``kind`` are open."""
        await self.wait_for(lambda: self.stream_count(kind) >= count)

    # -- control hooks -------------------------------------------------------------------

    def drop_connections(self) -> None:
        """Abort every websocket connection (TCP close, no close frame)."""
        for conn in list(self._http.conns):
            conn.abort("dropped by the test")

    def send_raw(self, data: bytes | str) -> None:
        """Send ``data`` as one message on every connection (binary for bytes,
        text for str), in order with the fake's other output."""
        payload = data.encode("utf-8") if isinstance(data, str) else data
        for conn in self._http.conns:
            conn.enqueue(payload)

    def send_notification(self, method: str, params: Mapping[str, Any]) -> None:
        """Send a notification with any method string on every connection."""
        for conn in self._http.conns:
            conn.notify(method, params)

    def end_streams(self, kind: str | None = None, *, code: int = CODE_EOF, message: str = "EOF") -> int:
        """End the open streams (of ``kind``, or all) with an error response to
        their opening id (10000 ``EOF`` = clean end). Returns how many ended."""
        return self._events.end_streams(kind, code, message)

    async def ping(self, payload: bytes) -> list[bytes]:
        """Ping every connection with ``payload`` (any length) and return the pong
        payloads that match it, one per connection that answered. Bound it with
        ``anyio.fail_after``."""
        answered: list[bytes] = []
        for conn in list(self._http.conns):
            got = conn.test_pings[payload] = anyio.Event()
            await conn.ws.ping(payload)
            await got.wait()
            answered.append(payload)
        return answered

    def pause_reading(self) -> None:
        """Stop reading from every connection (requests, acks and pongs stall)."""
        self._controls.pause_reading()

    def resume_reading(self) -> None:
        """Undo :meth:`pause_reading`."""
        self._controls.resume_reading()

    def hold(self, method: str) -> None:
        """Make unary ``method`` (``Service.Method``) block until :meth:`release`."""
        self._controls.hold(method)

    def release(self, method: str) -> None:
        """Let the calls of a held ``method`` go on (and later ones pass)."""
        self._controls.release(method)

    def fail_next_tip(self, failure: TipFailure | None = None) -> None:
        """Apply ``failure`` (default: one failed attempt that will be retried) to
        the next ``TipUser`` call; calls queue up in order."""
        self._controls.fail_next_tip(failure or TipFailure())
