"""A fake brclient: the clientrpc JSON-RPC server on loopback over mutual TLS,
faithful on the wire (clientrpc.md §9 checklist), backed by a :class:`FakeRelay`.

What it reproduces:

* TLS: Ed25519 certificates laid out like brclient's (:mod:`.certs`), a client
  certificate chaining to ``rpc-ca.cert`` is required; optional Basic auth with
  the 401/403 texts of §1 (checked before the websocket upgrade); the gorilla
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
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.abc
from aiohttp import WSMsgType, web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ...clientrpc.client import Client
from ...clientrpc.config import BotConfig
from ...clientrpc.protojson import dumps, frame
from ...clientrpc.types import (
    PublicIdentity,
    ReceivedPM,
    ReceivedTip,
    TipProgressEvent,
    VersionResponse,
)
from .certs import BRClientCerts, ensure_brclient_certs
from .params import Pairs, ParamsError, decode_params, plain
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

from ._conn import _WS_CLOSED, _Conn, _Stream
from ._limits import MAX_MSG_SIZE, RM_OVERHEAD, estimated_wire_size, whole_atoms_matoms
from ._protocol import (
    _ACKS,
    _STREAMS,
    CODE_EOF,
    CODE_INTERNAL,
    CODE_INVALID_PARAMS,
    KIND_PM,
    KIND_TIP_PROGRESS,
    KIND_TIP_RECEIVED,
    RPCFault,
    _basic_auth,
    _echo_id,
    _envelope,
    _go_float,
    _go_percent_f,
    _http_error,
    _method_name,
    _origin_ok,
    _pad16,
    _skip_ws,
)

log = logging.getLogger("brmcp.testing.fakebr")

Ev = TypeVar("Ev", ReceivedPM, ReceivedTip, TipProgressEvent)


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

    def public_identity(self) -> PublicIdentity:
        return PublicIdentity(
            name=self.name, nick=self.nick, sig_key=self.sig_key, identity=bytes.fromhex(self.uid)
        )

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
        ``[clientrpc]`` section of clientrpc.md §7)."""
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

    def _changed(self) -> None:
        if self._change is not None:
            self._change.set()
            self._change = anyio.Event()

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

    # -- events ----------------------------------------------------------------------------

    def _emit(self, kind: str, event: Ev, sequence_id: int | None = None) -> Ev:
        replay = self.logs[kind]
        line = dumps(event.to_wire())  # the stored line, before its id is known
        seq = replay.next_id(len(line.encode("utf-8")))
        if sequence_id is not None:
            seq = sequence_id
        stored = dataclasses.replace(event, sequence_id=seq)
        replay.append(seq, stored)
        params = stored.to_wire()
        for stream in list(self._streams[kind]):
            stream.conn.notify(stream.method, params)
        self._changed()
        return stored

    def emit_pm(
        self,
        from_uid: str,
        message: str,
        *,
        nick: str | None = None,
        timestamp_ms: int | None = None,
        mode: str = "MESSAGE_MODE_NORMAL",
    ) -> ReceivedPM:
        """Log a received PM (as if it came from ``from_uid``) and broadcast it."""
        return self._emit(
            KIND_PM,
            ReceivedPM(
                uid=from_uid,
                nick=self.relay.nicks.get(from_uid, "") if nick is None else nick,
                message=message,
                mode=mode,
                timestamp_ms=int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
                sequence_id=0,
            ),
        )

    def emit_received_tip(
        self, from_uid: str, amount_matoms: int, *, sequence_id: int | None = None
    ) -> ReceivedTip:
        """Log a received tip (milliatoms) and broadcast it. ``sequence_id``
        overrides the id the log would give it (hostile-brclient tests)."""
        return self._emit(
            KIND_TIP_RECEIVED,
            ReceivedTip(uid=from_uid, amount_matoms=amount_matoms, sequence_id=0),
            sequence_id,
        )

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
        """Log a tip-progress event for a tip to ``to_uid`` and broadcast it."""
        return self._emit(
            KIND_TIP_PROGRESS,
            TipProgressEvent(
                sequence_id=0,
                uid=to_uid,
                nick=self.relay.nicks.get(to_uid, "") if nick is None else nick,
                amount_matoms=amount_matoms,
                completed=completed,
                attempt=attempt,
                attempt_err=attempt_err,
                will_retry=will_retry,
            ),
        )

    def _receive_pm(self, from_uid: str, text: str, timestamp_ms: int) -> None:
        if len(text.encode("utf-8")) + RM_OVERHEAD > MAX_MSG_SIZE:
            # brclient's decompression is limited to the max message size: a
            # compressible PM the sender accepted is dropped here, silently.
            log.warning("fakebr: %s dropped a PM of %d bytes (zlib read limit)", self.nick, len(text))
            return
        self.emit_pm(from_uid, text, timestamp_ms=timestamp_ms)

    # -- HTTP -------------------------------------------------------------------------------

    def _auth_failure(self, request: web.Request) -> web.Response | None:
        """brclient's Basic-auth wrapper (clientrpc.md §1); None when the request passes."""
        if not self.rpcuser or not self.rpcpass:
            return _http_error(401, "Forbidden")
        creds = _basic_auth(request.headers.get("Authorization"))
        if creds is None:
            resp = _http_error(401, "Unauthorized")
            resp.headers["WWW-Authenticate"] = 'Basic realm="Restricted"'
            return resp
        if creds != (self.rpcuser, self.rpcpass):
            return _http_error(403, "Forbidden")
        return None

    async def _ws_handler(self, request: web.Request) -> web.StreamResponse:
        self.upgrade_headers.append(dict(request.headers))
        if self.auth_mode:
            failure = self._auth_failure(request)
            if failure is not None:
                return failure
        if not _origin_ok(request):
            resp = _http_error(403, "Forbidden")
            resp.headers["Sec-Websocket-Version"] = "13"
            return resp
        ws = web.WebSocketResponse(autoping=False, compress=False, max_msg_size=0, protocols=())
        transport = request.transport
        await ws.prepare(request)
        self._serial += 1
        self.total_connections += 1
        conn = _Conn(ws, transport, self._serial)
        self._conns.append(conn)
        self._changed()
        try:
            async with anyio.create_task_group() as tg:
                conn.tg = tg
                tg.start_soon(self._writer, conn)
                if self.ping_interval is not None and self.ping_interval > 0:
                    tg.start_soon(self._pinger, conn, self.ping_interval, self.ping_timeout)
                await self._read_loop(conn)
                tg.cancel_scope.cancel()
        finally:
            conn.closed = True
            conn.out.close()
            if conn in self._conns:
                self._conns.remove(conn)
            for streams in self._streams.values():
                streams[:] = [s for s in streams if s.conn is not conn]
            self._changed()
            if not ws.closed and transport is not None:
                transport.abort()
        return ws

    async def _post_handler(self, request: web.Request) -> web.StreamResponse:
        if self.auth_mode:
            failure = self._auth_failure(request)
            if failure is not None:
                return failure
        body = (await request.read()).decode("utf-8", errors="replace")
        resp = web.StreamResponse(status=200)
        resp.headers["Content-Type"] = "text/plain; charset=utf-8"
        await resp.prepare(request)
        decoder = json.JSONDecoder(object_pairs_hook=Pairs)
        pos = 0
        while True:
            pos = _skip_ws(body, pos)
            if pos >= len(body):
                break
            try:
                value, pos = decoder.raw_decode(body, pos)
            except ValueError:
                break
            env = _envelope(value)
            if env is None or env.get("jsonrpc") != "2.0":
                break
            method = env.get("method")
            if env.get("id") is None or not isinstance(method, str):
                continue
            try:
                result = await self._execute(None, method, env.get("params"), "params" in env)
                line = {"jsonrpc": "2.0", "id": _echo_id(env["id"]), "result": result}
            except RPCFault as fault:
                line = {
                    "jsonrpc": "2.0",
                    "id": _echo_id(env["id"]),
                    "error": {"code": fault.code, "message": fault.message},
                }
            await resp.write(frame(line))
        if not self.auth_mode:
            # brclient's auth wrapper does not return after serving: it goes on
            # checking and appends its error text to the POST response.
            appended = self._auth_failure(request)
            if appended is not None and appended.text is not None:
                await resp.write(appended.text.encode("utf-8"))
        await resp.write_eof()
        return resp

    # -- websocket connection -----------------------------------------------------------------

    async def _writer(self, conn: _Conn) -> None:
        try:
            async with conn.out_recv:
                async for data in conn.out_recv:
                    await conn.ws.send_bytes(data)
        except (ConnectionError, RuntimeError) as exc:
            conn.abort(f"write failed: {exc}")

    async def _pinger(self, conn: _Conn, interval: float, wait: float) -> None:
        while True:
            await anyio.sleep(interval)
            data = os.urandom(16)
            conn.keepalive_ping = data
            conn.keepalive_pong = anyio.Event()
            try:
                await conn.ws.ping(data)
            except (ConnectionError, RuntimeError):
                conn.abort("ping failed")
                return
            with anyio.move_on_after(wait) as scope:
                await conn.keepalive_pong.wait()
            if scope.cancelled_caught:
                log.info("fakebr: %s: pong timeout; dropping the connection", self.nick)
                conn.abort("pong timeout")
                return

    def _on_pong(self, conn: _Conn, data: bytes) -> None:
        conn.pongs.append(data)
        waiter = conn.test_pings.pop(data, None)
        if waiter is not None:
            waiter.set()
            return
        if conn.keepalive_ping is not None:
            if data != conn.keepalive_ping:
                log.info("fakebr: %s: ping data != pong data; dropping the connection", self.nick)
                conn.abort("ping data != pong data")
                return
            conn.keepalive_ping = None
            conn.keepalive_pong.set()

    async def _read_loop(self, conn: _Conn) -> None:
        ws = conn.ws
        while not conn.closed:
            paused = self._paused
            if paused is not None:
                await paused.wait()
                continue
            msg = await ws.receive()
            if msg.type == WSMsgType.PING:
                data = bytes(msg.data)
                self.pings_received.append(data)
                self._changed()
                await ws.pong(_pad16(data))
                continue
            if msg.type == WSMsgType.PONG:
                self._on_pong(conn, bytes(msg.data))
                continue
            if msg.type in _WS_CLOSED:
                return
            raw = msg.data if isinstance(msg.data, bytes) else str(msg.data).encode("utf-8")
            self.frames_in.append(raw)
            if not await self._on_message(conn, raw):
                conn.abort("bad message")
                return

    async def _on_message(self, conn: _Conn, raw: bytes) -> bool:
        """Handle one client message; False closes the connection."""
        try:
            text = raw.decode("utf-8")
            value, _ = json.JSONDecoder(object_pairs_hook=Pairs).raw_decode(text, _skip_ws(text, 0))
        except (UnicodeDecodeError, ValueError):
            log.info("fakebr: %s: malformed JSON from the client; closing", self.nick)
            return False
        env = _envelope(value)
        if env is None:
            log.info("fakebr: %s: a message that is not a JSON object; closing", self.nick)
            return False
        if env.get("jsonrpc") != "2.0":
            log.info('fakebr: %s: jsonrpc is not "2.0"; closing', self.nick)
            return False
        has_id = env.get("id") is not None
        method = env.get("method")
        has_outcome = "result" in env or "error" in env
        if has_id and method is not None and not has_outcome:
            if not isinstance(method, str):
                return False
            while conn.in_flight >= self.max_in_flight:  # stop reading until a slot frees
                await conn.slot_freed.wait()
            conn.in_flight += 1
            self.max_in_flight_seen = max(self.max_in_flight_seen, conn.in_flight)
            self.requests.append((method, plain(env.get("params"))))
            self._changed()
            assert conn.tg is not None
            conn.tg.start_soon(
                self._handle_request, conn, env["id"], method, env.get("params"), "params" in env
            )
        elif not has_id and method is not None and not has_outcome:
            log.debug("fakebr: %s: ignoring a client notification %r", self.nick, method)
        else:
            log.debug("fakebr: %s: ignoring an unrecognized message", self.nick)
        return True

    async def _handle_request(
        self, conn: _Conn, request_id: Any, method: str, params: Any, present: bool
    ) -> None:
        try:
            name = _method_name(method)
            kind = _STREAMS.get(name)
            if kind is not None:
                request = self._decode(name, params, present)
                await self._serve_stream(conn, request_id, method, kind, request)
                return
            result = await self._execute(conn, method, params, present)
            conn.respond(request_id, result=result)
        except RPCFault as fault:
            conn.respond(request_id, error=(fault.code, fault.message))
        except Exception as exc:
            log.exception("fakebr: %s: handler for %s failed", self.nick, method)
            conn.respond(request_id, error=(CODE_INTERNAL, str(exc)))
        finally:
            conn.release_slot()
            self._changed()

    async def _serve_stream(self, conn: _Conn, request_id: Any, method: str, kind: str, request: Any) -> None:
        unacked_from = int(request.get("unacked_from", 0))
        stream = _Stream(conn, request_id, method, kind)
        # Replay and registration in one step, so no event falls between them.
        for event in self.logs[kind].after(unacked_from):
            conn.notify(method, event.to_wire())
        self._streams[kind].append(stream)
        conn.streams.append(stream)
        self._changed()
        try:
            await stream.ended.wait()
        finally:
            if stream in self._streams[kind]:
                self._streams[kind].remove(stream)
            if stream in conn.streams:
                conn.streams.remove(stream)
        conn.respond(request_id, error=stream.end)

    def _decode(self, name: str, params: Any, present: bool) -> dict[str, Any]:
        try:
            return decode_params(name, params, present=present)
        except ParamsError as exc:
            raise RPCFault(CODE_INVALID_PARAMS, f"unable to decode params: {exc}") from None

    async def _execute(self, conn: _Conn | None, method: str, params: Any, present: bool) -> Any:
        """Run a unary method; returns the protojson result or raises :class:`RPCFault`."""
        name = _method_name(method)
        if name in _STREAMS:
            raise RPCFault(CODE_INTERNAL, "fakebr: streams need the websocket transport")
        request = self._decode(name, params, present)
        gate = self._holds.get(name)
        if gate is not None:
            await gate.wait()
        if name == "VersionService.Version":
            return self.version.to_wire()
        if name == "ChatService.UserPublicIdentity":
            return self.public_identity().to_wire()
        if name == "ChatService.PM":
            await self._pm(request)
            return {}
        if name == "PaymentsService.TipUser":
            await self._tip_user(request)
            return {}
        kind = _ACKS.get(name)
        if kind is not None:
            self.logs[kind].ack(int(request.get("sequence_id", 0)))
            self._changed()
            return {}
        raise RPCFault(CODE_INTERNAL, "unknown method")  # pragma: no cover - MESSAGES and handlers agree

    # -- handlers ---------------------------------------------------------------------------------

    def _user_by_nick(self, user: str) -> str:
        """brclient's ``UserByNick``: a contact whose nick matches (case-insensitively,
        standing in for brclient's collator), else one whose hex id starts with
        ``user`` when that is longer than 4 characters."""
        contacts = self.relay.contacts(self.uid)
        wanted = user.casefold()
        for uid in contacts:
            if self.relay.nicks.get(uid, "").casefold() == wanted:
                return uid
        if len(user) > 4:
            for uid in contacts:
                if uid.startswith(user):
                    return uid
        raise RPCFault(CODE_INTERNAL, f"user {user} not found")

    async def _pm(self, request: Mapping[str, Any]) -> None:
        target = self._user_by_nick(str(request.get("user", "")))
        msg = request.get("msg")
        if msg is None:
            raise RPCFault(CODE_INTERNAL, "msg is nil")
        text = str(msg.get("message", ""))
        if not text:
            raise RPCFault(CODE_INTERNAL, "msg is empty")
        estimate = estimated_wire_size(text)
        if estimate > MAX_MSG_SIZE:
            raise RPCFault(
                CODE_INTERNAL,
                "cannot enqueue message rpc.RMPrivateMessage estimated as larger than max message size "
                f"{estimate} > {MAX_MSG_SIZE}: RM is too large",
            )
        # A brclient that is off the relay holds the call until it is back.
        await self.relay.wait_online(self.uid)
        try:
            await self.relay.send_pm(self.uid, target, text, pacing=self.pm_pacing)
        except Exception as exc:  # the fabric's size limit or an injected link failure
            raise RPCFault(CODE_INTERNAL, str(exc)) from None

    async def _tip_user(self, request: Mapping[str, Any]) -> None:
        """brclient's order: the user, the remote-tip guards, then the amount
        and attempts, then the wait for the tip subsystem (the restart delay),
        then the amount's conversion to whole atoms."""
        user = str(request.get("user", ""))
        target = self._user_by_nick(user)
        dcr_amount = float(request.get("dcr_amount", 0.0))
        if not self.allow_remote_send_tip:
            raise RPCFault(CODE_INTERNAL, "remote tip sending not allowed")
        if self.max_remote_send_tip_amt > 0 and dcr_amount > self.max_remote_send_tip_amt:
            raise RPCFault(CODE_INTERNAL, f"tip exceeds max limit: {_go_float(self.max_remote_send_tip_amt)}")
        if dcr_amount <= 0:
            raise RPCFault(CODE_INTERNAL, f"cannot pay user {_go_percent_f(dcr_amount)} <= 0")
        max_attempts = int(request.get("max_attempts", 0))
        if max_attempts <= 0:
            raise RPCFault(CODE_INTERNAL, f"maxAttempts {max_attempts} <= 0")
        ready = self._started_at + self.tip_restart_delay - time.monotonic()
        if ready > 0:
            await anyio.sleep(ready)
        if math.isnan(dcr_amount) or math.isinf(dcr_amount):
            raise RPCFault(CODE_INTERNAL, "invalid coin amount")
        failure = self._tip_failures.pop(0) if self._tip_failures else None
        self.relay.start_tip(self, target, whole_atoms_matoms(dcr_amount), max_attempts, failure)


def _by_value(decode: Callable[[Any], Any]) -> Callable[[Any, int], Any]:
    """A :meth:`ReplayLog.restore` decoder that needs only the stored value."""

    def restore(value: Any, _seq: int) -> Any:
        return decode(value)

    return restore
