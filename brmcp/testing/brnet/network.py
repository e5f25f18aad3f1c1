"""Running brnet: a real Bison Relay relay and real clients (bisonrelay's own
client and clientrpc server code) on loopback, as a subprocess.

``BrNet(root, users=("alice", "bob")).start()`` builds brnet if needed, starts
it, waits for its ready line and reads ``<root>/brnet.json``. The root is
persistent: :meth:`BrNet.restart` (or a new :class:`BrNet` on the same root)
keeps uids, KX, ports and clientrpc replay logs. Every method here blocks;
from async code call them through ``anyio.to_thread.run_sync``, except
:func:`mediated_kx`, which is async.

Key exchange: ``kx`` chooses the pairs KX'd at start (every pair by
default); :meth:`BrNet.kx` KXs two more later; :func:`mediated_kx` has one
user KX with another through a third (``ChatService.MediateKX``) and waits
for both ``KXCompleted`` events. Each user also has a status server like
brclientd's (:attr:`BrNetUser.status_url`: ``POST /contacts/suggest-kx``,
the client library's ``SuggestKX``, on the clientrpc mutual TLS).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...clientrpc import BotConfig, Client, KXCompleted, Subscription, load_bot_config, write_bot_config
from ...clientrpc.types import check_uid
from .build import brnet_binary

__all__ = ["BrNet", "BrNetError", "BrNetUser", "mediated_kx"]

READY_PREFIX = "brnet ready "
#: What brnet keeps across restarts in its root (uids, KX, ports).
STATE_FILE = "brnet-state.json"


class BrNetError(RuntimeError):
    """brnet failed to start, exited, or refused a control request (one line,
    plus the tail of brnet's stderr where it helps)."""


@dataclass(frozen=True, slots=True)
class BrNetUser:
    """One user of a running brnet, as ``brnet.json`` describes it.

    ``uid``: 64 lowercase hex characters; ``brrpcurl``: ``wss://127.0.0.1:PORT/ws``;
    the certificate paths are brclient's ``rpc.cert``, ``rpc-ca.cert``,
    ``rpc-client.cert`` and ``rpc-client.key``; ``conf``: a bisonbotkit-style
    conf naming them (``brmcp-serve.conf`` / ``brmcp-bridge.conf`` as is);
    ``root``: the user's brclient-style root; ``nowallet``: uses brclient's stock
    no-wallet payment client (tips never complete); ``status_url``: its
    brclientd-style status server, ``https://127.0.0.1:PORT`` (``""`` from a
    brnet built before it had one).
    """

    nick: str
    uid: str
    brrpcurl: str
    servercertpath: Path
    cacertpath: Path
    clientcertpath: Path
    clientkeypath: Path
    rpcuser: str
    rpcpass: str
    conf: Path
    root: Path
    nowallet: bool
    status_url: str = field(default="")

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> BrNetUser:
        return cls(
            nick=str(obj["nick"]),
            uid=str(obj["uid"]),
            brrpcurl=str(obj["brrpcurl"]),
            servercertpath=Path(obj["servercertpath"]),
            cacertpath=Path(obj["cacertpath"]),
            clientcertpath=Path(obj["clientcertpath"]),
            clientkeypath=Path(obj["clientkeypath"]),
            rpcuser=str(obj.get("rpcuser", "")),
            rpcpass=str(obj.get("rpcpass", "")),
            conf=Path(obj["conf"]),
            root=Path(obj["root"]),
            nowallet=bool(obj.get("nowallet", False)),
            status_url=str(obj.get("brstatusurl", "")),
        )

    def bot_config(self) -> BotConfig:
        """The user's conf, parsed (:func:`brmcp.clientrpc.load_bot_config`).
        It has no ``brstatusurl``; set it from :attr:`status_url` where a
        host should suggest KXs."""
        return load_bot_config(self.conf)

    def client(self, **kwargs: Any) -> Client:
        """A clientrpc :class:`~brmcp.clientrpc.Client` for this user
        (``kwargs``: the client's other constructor arguments; ``status_url``
        defaults to :attr:`status_url`, so :meth:`Client.suggest_kx` works)."""
        kwargs.setdefault("status_url", self.status_url)
        return Client.from_config(self.bot_config(), **kwargs)

    @property
    def url(self) -> str:
        """The clientrpc URL (``brrpcurl``)."""
        return self.brrpcurl

    def bot_config_for(self, datadir: str | os.PathLike[str], name: str) -> BotConfig:
        """The user's conf with ``datadir`` set to ``datadir`` and ``logfile``
        to ``<datadir>/logs/<name>.log`` (everything else as brnet wrote it)."""
        cfg = self.bot_config()
        cfg.datadir = os.fspath(datadir)
        cfg.logfile = os.fspath(Path(datadir) / "logs" / f"{name}.log")
        return cfg

    def install_conf(self, datadir: Path, name: str) -> Path:
        """Write :meth:`bot_config_for` to ``<datadir>/<name>.conf`` (mode 0600),
        the file brmcp-serve (``brmcp-serve``) and brmcp-bridge
        (``brmcp-bridge``) read; returns its path."""
        datadir.mkdir(parents=True, exist_ok=True)
        path = datadir / f"{name}.conf"
        write_bot_config(path, self.bot_config_for(datadir, name))
        return path


class BrNet:
    """A brnet subprocess on ``root``.

    Options (brnet flags): ``users`` (nicks), ``latency_ms`` (one-way latency
    added to each message a user sends), ``nowallet`` (nicks on brclient's stock
    no-wallet payment client, or ``("all",)``), ``tip_restart_delay`` (seconds
    ``TipUser`` blocks after a client connects to the relay: brclient's
    ``[tipuser] restartdelay``, brnet's ``-tiprestartdelay``; their default is
    60, the default here 1 so a first paid call does not wait; ``python -m
    brmcp.testing.brnet`` uses 1 too), ``reconnect_delay`` (seconds, brclient's
    is 5), ``tip_max_lifetime`` / ``tip_rerequest_delay`` (seconds; brclient:
    72 h / 24 h), ``kx`` (the pairs KX'd at start: ``"all"``, ``"none"`` or
    ``(nick, nick)`` pairs; brnet's ``-kx``; pairs KX'd on an earlier run on
    the root stay KX'd), ``extra_args`` (more brnet flags). ``binary``: a brnet
    executable (default: :func:`~brmcp.testing.brnet.build.brnet_binary`).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        users: Sequence[str] = ("alice", "bob"),
        latency_ms: float = 0,
        nowallet: Sequence[str] = (),
        tip_restart_delay: float = 1.0,
        reconnect_delay: float = 0.5,
        tip_max_lifetime: float | None = None,
        tip_rerequest_delay: float | None = None,
        kx: str | Sequence[tuple[str, str]] = "all",
        extra_args: Sequence[str] = (),
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.root = Path(root).resolve()
        self.users_wanted = tuple(users)
        self.latency_ms = latency_ms
        self.nowallet = tuple(nowallet)
        self.tip_restart_delay = tip_restart_delay
        self.reconnect_delay = reconnect_delay
        self.tip_max_lifetime = tip_max_lifetime
        self.tip_rerequest_delay = tip_rerequest_delay
        self.kx_flag = _kx_flag(kx, self.users_wanted)
        self.extra_args = tuple(extra_args)
        self._binary = Path(binary) if binary is not None else None
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: Any = None
        self.info: dict[str, Any] = {}
        self.users: dict[str, BrNetUser] = {}
        self.start_seconds = 0.0

    # -- lifecycle ---------------------------------------------------------

    def command(self) -> list[str]:
        """The brnet command line this instance runs."""
        exe = self._binary if self._binary is not None else brnet_binary()

        def dur(seconds: float) -> str:
            return f"{round(seconds * 1000)}ms"

        cmd = [
            str(exe),
            "-root",
            str(self.root),
            "-users",
            ",".join(self.users_wanted),
            "-latency",
            dur(self.latency_ms / 1000),
            "-tiprestartdelay",
            dur(self.tip_restart_delay),
            "-reconnectdelay",
            dur(self.reconnect_delay),
        ]
        if self.nowallet:
            cmd += ["-nowallet", ",".join(self.nowallet)]
        if self.tip_max_lifetime is not None:
            cmd += ["-tipmaxlifetime", dur(self.tip_max_lifetime)]
        if self.tip_rerequest_delay is not None:
            cmd += ["-tiprerequestinvoicedelay", dur(self.tip_rerequest_delay)]
        if self.kx_flag != "all":
            cmd += ["-kx", self.kx_flag]
        return cmd + list(self.extra_args)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> BrNet:
        """Start brnet and wait for its ready line (at most ``startup_timeout``
        seconds, not counting the build). Raises :class:`BrNetError`.

        brnet picks free ports on a fresh root and binds them a moment later;
        another process may take one in between ("address already in use").
        A first start that fails so is tried again (at most three times) on
        an emptied root, where brnet picks new ports; a restart keeps its
        ports (the daemons' configs name them) and is not retried."""
        fresh = not (self.root / STATE_FILE).exists()
        for attempt in range(3):
            try:
                return self._start_once()
            except BrNetError as exc:
                if not fresh or attempt == 2 or "address already in use" not in str(exc):
                    raise
                shutil.rmtree(self.root, ignore_errors=True)
        raise AssertionError("the loop returns or raises")

    def _start_once(self) -> BrNet:
        if self.running:
            raise BrNetError("brnet is already running")
        cmd = self.command()
        self.root.mkdir(parents=True, exist_ok=True)
        self._stderr = open(self.root / "brnet.stderr.log", "a")  # noqa: SIM115 - closed in stop()
        began = time.monotonic()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._stderr, stdin=subprocess.DEVNULL, text=True
        )
        self._proc = proc
        ready: list[str] = []

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(READY_PREFIX):
                    ready.append(line[len(READY_PREFIX) :].strip())
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.startup_timeout)
        if not ready:
            code = proc.poll()
            self.stop()
            why = f"exited with status {code}" if code is not None else "timed out"
            raise BrNetError(f"brnet {why} before it was ready: {self.stderr_tail()}")
        self.start_seconds = time.monotonic() - began
        self._load_info(Path(ready[0]))
        return self

    def _load_info(self, path: Path) -> None:
        self.info = json.loads(path.read_text())
        self.users = {u["nick"]: BrNetUser.from_json(u) for u in self.info["users"]}

    def stderr_tail(self, lines: int = 5) -> str:
        """The last lines of brnet's stderr log (one line, ``|``-joined)."""
        try:
            text = (self.root / "brnet.stderr.log").read_text(errors="replace")
        except OSError:
            return "(no stderr log)"
        tail = [ln for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(tail) or "(stderr empty)"

    def stop(self, timeout: float = 20.0) -> None:
        """Stop brnet (SIGTERM, then SIGKILL after ``timeout`` seconds). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def restart(self, down_seconds: float = 0.0) -> BrNet:
        """Stop brnet and start it again on the same root (same uids, KX, ports
        and replay logs), ``down_seconds`` later."""
        self.stop()
        if down_seconds > 0:
            time.sleep(down_seconds)
        return self.start()

    def __enter__(self) -> BrNet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- users and control -------------------------------------------------

    def user(self, nick: str) -> BrNetUser:
        """The named user (``KeyError`` if brnet has no such user)."""
        return self.users[nick]

    def _control(self, path: str, method: str = "POST") -> dict[str, Any]:
        if not self.running:
            raise BrNetError("brnet is not running")
        req = urllib.request.Request(
            self.info["control"] + path, method=method, data=b"" if method == "POST" else None
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                result: dict[str, Any] = json.loads(resp.read())
                return result
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error", "")
            except ValueError:
                detail = ""
            raise BrNetError(f"brnet control {path}: HTTP {exc.code} {detail}".strip()) from exc

    def status(self) -> dict[str, Any]:
        """``{"users": [{"nick", "running", "online", "connected"}, ...]}``."""
        return self._control("/status", method="GET")

    def offline(self, nick: str) -> None:
        """Disconnect ``nick``'s client from the relay and keep it off (its
        clientrpc server stays up; its PM calls block, as a real brclient's do)."""
        self._control(f"/offline/{nick}")

    def online(self, nick: str) -> None:
        """Let ``nick``'s client reconnect to the relay (after the reconnect delay)."""
        self._control(f"/online/{nick}")

    def new_gc(self, nick: str, name: str) -> None:
        """Have ``nick`` create a group chat called ``name`` (clientrpc has no
        method for it); ``nick`` is its admin and may invite with
        ``GCService.InviteToGC``. Raises :class:`BrNetError` on failure."""
        self._control(f"/newgc/{nick}?name={urllib.parse.quote(name)}")

    def post(self, nick: str, text: str) -> None:
        """Have ``nick`` publish a post with body ``text`` to its subscribers
        (clientrpc has no method for it). Raises :class:`BrNetError` on failure."""
        self._control(f"/post/{nick}?text={urllib.parse.quote(text)}")

    def comment(self, nick: str, author_uid: str, post_id: str, text: str) -> None:
        """Have ``nick`` comment ``text`` on the post ``post_id`` (64 hex) it
        received from ``author_uid`` (64 hex); the author gets a post-status
        update. Raises :class:`BrNetError` on failure."""
        q = urllib.parse.urlencode({"from": author_uid, "pid": post_id, "text": text})
        self._control(f"/comment/{nick}?{q}")

    def fetch(self, nick: str, uid: str, path: str) -> None:
        """Have ``nick`` request the resource ``path`` (slash-separated) from
        the user ``uid`` (64 hex), whose ``ResourcesService.RequestsStream``
        receives the request. Raises :class:`BrNetError` on failure."""
        q = urllib.parse.urlencode({"uid": uid, "path": path})
        self._control(f"/fetch/{nick}?{q}")

    def restart_user(self, nick: str, down_seconds: float = 0.0) -> None:
        """Restart ``nick``'s client and clientrpc server on the same root and
        port (a brclient restart), down for ``down_seconds``; returns once it
        is connected to the relay again."""
        self._control(f"/restart/{nick}?downms={int(down_seconds * 1000)}")

    def kx(self, nick: str, other: str) -> None:
        """KX ``nick`` and ``other`` now (an invite, as brnet does at start);
        returns once both have the other as a contact. Raises
        :class:`BrNetError` on failure."""
        self._control(f"/kx/{nick}?with={urllib.parse.quote(other)}")


def _kx_flag(kx: str | Sequence[tuple[str, str]], users: Sequence[str]) -> str:
    """brnet's ``-kx`` value for the ``kx`` option; ``ValueError`` naming
    the option, the value and the allowed forms for anything else."""
    if isinstance(kx, str):
        if kx in ("all", "none"):
            return kx
        raise ValueError(f"kx {kx!r}: use 'all', 'none' or a sequence of (nick, nick) pairs")
    pairs = []
    for pair in kx:
        if len(pair) != 2 or pair[0] == pair[1] or any(n not in users for n in pair):
            raise ValueError(f"kx pair {pair!r}: use two different nicks of users {list(users)}")
        pairs.append(f"{pair[0]}:{pair[1]}")
    return ",".join(pairs) if pairs else "none"


async def mediated_kx(net: BrNet, nick: str, mediator: str, target: str) -> None:
    """Have ``nick`` KX with ``target`` through ``mediator`` (brclient's
    ``/mi``: ``ChatService.MediateKX`` on ``nick``'s clientrpc) and wait until
    both report the exchange on their ``ChatService.KXStream``; the
    ``KXCompleted`` events are acked. ``mediator`` must be a contact of both;
    it never returns otherwise (the mediator drops the request): bound it
    with ``anyio.fail_after``. Raises :class:`RPCError
    <brmcp.clientrpc.RPCError>` when brclient refuses the request."""
    me, via, other = net.user(nick), net.user(mediator), net.user(target)
    async with me.client(ping_interval=None) as cme, other.client(ping_interval=None) as cother:
        await cme.wait_connected()
        await cother.wait_connected()
        mine, theirs = cme.kx_stream(), cother.kx_stream()
        await mine.wait_open()
        await theirs.wait_open()
        await cme.mediate_kx(check_uid(via.uid, "mediator"), check_uid(other.uid, "target"))
        await _wait_kx(cme, mine, other.uid)
        await _wait_kx(cother, theirs, me.uid)


async def _wait_kx(client: Client, stream: Subscription[KXCompleted], uid: str) -> KXCompleted:
    async for event in stream:
        await client.ack_kx_completed(event.sequence_id)
        if event.uid == uid:
            return event
    raise BrNetError("the KX stream ended before the exchange completed")
