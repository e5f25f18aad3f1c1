"""The Go reference's directory and provider as live peers on a Fabric
(``brmcp-goref directory|provider``, interop/go/directory.go and
provider.go, attached through :class:`~brmcp.testing.pipe.PipePeer`).

Money never moves by itself here: every payment the Go side launches (the
directory's paid test calls and snapshot purchases, the provider's listing
funding) arrives as a ``pay`` line and is handed to the ``pay`` callback
the test passes, which credits the payee's ledger (as the payee's tip
stream would) and returns; the payment is then reported settled. A
callback that raises reports the payment failed with the exception's text
(a definitive rail failure: the Go side records no spend). So a test's
books see every atom that leaves a Go peer.

Suggestions and introductions (the directory's ``Suggester`` and
``Introducer``) are recorded and answered the same way, through optional
callbacks (default: succeed).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from brmcp.server import CallContext, Harness
from brmcp.testing import Fabric, uid
from brmcp.testing.pipe import PipePeer

__all__ = [
    "ADMIN",
    "DIRECTORY",
    "PEER_DIRECTORY",
    "PROVIDER",
    "GoDirectory",
    "GoProvider",
    "KXFunc",
    "PayFunc",
    "add_probe_tools",
    "go_autofund_provider",
    "go_directory",
    "go_directory_pair",
    "go_provider",
]

#: The directory's uid in these tests.
DIRECTORY = uid(0xD)
#: A provider registering at the directory.
PROVIDER = uid(0xE)
#: The directory operator (listed in ``admin_uids``) and its search client.
ADMIN = uid(0xA)
#: A second directory, federating with :data:`DIRECTORY`.
PEER_DIRECTORY = uid(0xB)

#: ``await pay(payee_uid, atoms)``: move the atoms to the payee (raise to fail).
PayFunc = Callable[[str, int], Awaitable[None]]
#: ``await kx(a_uid, b_uid)``: a suggestion (invitee, target) or an
#: introduction (mediator, target); raise to fail it.
KXFunc = Callable[[str, str], Awaitable[None]]


async def _refuse(payee: str, atoms: int) -> None:
    raise RuntimeError(f"no payer configured for {atoms} atoms to {payee[:8]}")


async def _accept(_a: str, _b: str) -> None:
    return None


@dataclass
class _Asks:
    """The settle side of interop/go/asks.go: answers pay, suggest and
    introduce lines through the callbacks and records each."""

    pay: PayFunc
    suggest: KXFunc
    introduce: KXFunc
    peer: list[PipePeer] = field(default_factory=list)
    #: Settled payments, in order: (payee uid, atoms).
    payments: list[tuple[str, int]] = field(default_factory=list)
    #: Payments the callback failed: (payee uid, atoms, error text).
    failed_payments: list[tuple[str, int, str]] = field(default_factory=list)
    #: Suggester calls: (invitee uid, target uid).
    suggestions: list[tuple[str, str]] = field(default_factory=list)
    #: Introducer calls: (mediator uid, target uid).
    introductions: list[tuple[str, str]] = field(default_factory=list)

    async def _settle(self, ident: int, error: str) -> None:
        await self.peer[0].send("settle", {"id": ident, "error": error})

    async def on_pay(self, body: dict[str, Any]) -> None:
        payee, atoms = str(body["payee"]), int(body["atoms"])
        try:
            await self.pay(payee, atoms)
        except Exception as exc:
            self.failed_payments.append((payee, atoms, str(exc)))
            await self._settle(int(body["id"]), str(exc) or type(exc).__name__)
            return
        self.payments.append((payee, atoms))
        await self._settle(int(body["id"]), "")

    async def on_suggest(self, body: dict[str, Any]) -> None:
        pair = (str(body["invitee"]), str(body["target"]))
        self.suggestions.append(pair)
        await self._answer(int(body["id"]), self.suggest, pair)

    async def on_introduce(self, body: dict[str, Any]) -> None:
        pair = (str(body["mediator"]), str(body["target"]))
        self.introductions.append(pair)
        await self._answer(int(body["id"]), self.introduce, pair)

    async def _answer(self, ident: int, fn: KXFunc, pair: tuple[str, str]) -> None:
        try:
            await fn(*pair)
        except Exception as exc:
            await self._settle(ident, str(exc) or type(exc).__name__)
            return
        await self._settle(ident, "")

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[None]]]:
        return {"pay": self.on_pay, "suggest": self.on_suggest, "introduce": self.on_introduce}


@dataclass
class GoDirectory:
    """A running reference directory (``directory.Service``) at :attr:`uid`.

    :attr:`pub_key` is its snapshot signing key (hex ed25519) and
    :attr:`name` its policy name; :attr:`payments`,
    :attr:`failed_payments`, :attr:`suggestions` and
    :attr:`introductions` record what it asked for (see the module text).
    """

    peer: PipePeer
    uid: str
    data_dir: Path
    pub_key: str
    name: str
    asks: _Asks

    @property
    def payments(self) -> list[tuple[str, int]]:
        return self.asks.payments

    @property
    def failed_payments(self) -> list[tuple[str, int, str]]:
        return self.asks.failed_payments

    @property
    def suggestions(self) -> list[tuple[str, str]]:
        return self.asks.suggestions

    @property
    def introductions(self) -> list[tuple[str, str]]:
        return self.asks.introductions

    async def credit_tip(self, from_uid: str, atoms: int) -> int:
        """Report a received tip of ``atoms`` from ``from_uid``
        (``Service.CreditTip``: credits the sender's balance and moves a
        registration awaiting funding forward, debiting its fee). Returns
        the sender's balance right after, in atoms."""
        reply = await self.peer.request("tip", {"from": from_uid, "atoms": atoms}, reply="credited")
        return int(reply["balance"])

    async def balance(self, of: str) -> int:
        """``of``'s balance in the directory's ledger, atoms (a provider's
        is its escrow)."""
        reply = await self.peer.request("balance", {"uid": of}, reply="balance")
        return int(reply["balance"])

    async def notify_kx(self, of: str) -> None:
        """Report a completed key exchange with ``of`` (``Service.NotifyKX``)."""
        reply = await self.peer.request("kx", {"uid": of}, reply="ack")
        if reply.get("error"):
            raise RuntimeError(f"notify_kx: {reply['error']}")

    async def state(self) -> dict[str, Any]:
        """The persisted state: ``index``, ``peers``, ``leads`` (uid-keyed
        objects, the files ``index.json``, ``peers.json``, ``leads.json``),
        ``spend`` (the outbound-spend journal ``spend.json``, a list), each
        None before its file exists; ``adminlog`` (the entries of
        ``adminlog.json``), ``pubKey`` and ``live`` (listings published).
        Raises RuntimeError when a file cannot be read or is not JSON."""
        state = await self.peer.request("dump", {}, reply="state")
        if state.get("error"):
            raise RuntimeError(f"directory state: {state['error']}")
        return state


@asynccontextmanager
async def go_directory(
    fabric: Fabric,
    binary: Path,
    data_dir: Path,
    policy: dict[str, Any],
    *,
    at: str = DIRECTORY,
    pay: PayFunc = _refuse,
    suggest: KXFunc = _accept,
    introduce: KXFunc = _accept,
    args: Sequence[str] = (),
) -> AsyncIterator[GoDirectory]:
    """Run the reference directory at ``at`` with ``policy`` (the
    ``brmcpdir.json`` keys, written to ``data_dir/brmcpdir.json``; absent
    keys take the reference's defaults, ``calls_per_minute`` defaults to
    100,000). ``pay``/``suggest``/``introduce`` answer its asks; ``args``
    are more ``brmcp-goref directory`` flags (e.g. ``-now``,
    ``-suggester=false``)."""
    await anyio.Path(data_dir).mkdir(parents=True, exist_ok=True)
    policy_file = data_dir / "brmcpdir.json"
    await anyio.Path(policy_file).write_text(json.dumps(policy))
    asks = _Asks(pay, suggest, introduce)
    argv = [str(binary), "directory", "-datadir", str(data_dir), "-policy", str(policy_file), "-self", at]
    argv += list(args)
    async with PipePeer(fabric, at, argv, handlers=asks.handlers()) as peer:
        asks.peer.append(peer)
        ready = await peer.next("ready")
        yield GoDirectory(peer, at, data_dir, str(ready["pubKey"]), str(ready["name"]), asks)


@asynccontextmanager
async def go_directory_pair(
    fabric: Fabric,
    binary: Path,
    data_dir: Path,
    policy: dict[str, Any],
    *,
    first_pays: PayFunc,
    second_pays: PayFunc,
    args: Sequence[str] = (),
) -> AsyncIterator[tuple[GoDirectory, GoDirectory]]:
    """Two reference directories to federate, started in this order: the
    first at :data:`DIRECTORY` with ``policy`` (data in ``data_dir/first``,
    payments settled by ``first_pays``) and the second at
    :data:`PEER_DIRECTORY` with ``policy`` named ``interop-peer``
    (``data_dir/second``, ``second_pays``); ``args`` go to both (see
    :func:`go_directory`)."""
    async with (
        go_directory(fabric, binary, data_dir / "first", policy, pay=first_pays, args=args) as first,
        go_directory(
            fabric,
            binary,
            data_dir / "second",
            {**policy, "name": "interop-peer"},
            at=PEER_DIRECTORY,
            pay=second_pays,
            args=args,
        ) as second,
    ):
        yield first, second


@dataclass
class GoProvider:
    """A running reference harness with the priced ``test`` tool, a free
    ``echo`` and a ``directory.Registrant`` (its ``listing_invite`` tool
    included) at :attr:`uid`. :attr:`payments` are the Registrant's
    funding payments; :attr:`notices` the Registrant's Notify calls as
    ``(directory uid, StatusOut JSON, error text)``."""

    peer: PipePeer
    uid: str
    data_dir: Path
    asks: _Asks

    @property
    def payments(self) -> list[tuple[str, int]]:
        return self.asks.payments

    @property
    def failed_payments(self) -> list[tuple[str, int, str]]:
        return self.asks.failed_payments

    @property
    def notices(self) -> list[tuple[str, dict[str, Any], str]]:
        return [
            (str(body["directory"]), dict(body["status"]), str(body["error"]))
            for kind, body in self.peer.controls
            if kind == "notify"
        ]

    def executions(self, tool: str) -> int:
        """How many times ``tool``'s handler ran."""
        return sum(1 for kind, body in self.peer.controls if kind == "exec" and body.get("tool") == tool)

    async def credit(self, payer: str, atoms: int) -> int:
        """Credit ``atoms`` to ``payer``'s balance in the provider's ledger
        (a tip landing); returns the balance after."""
        reply = await self.peer.request("tip", {"from": payer, "atoms": atoms}, reply="credited")
        return int(reply["balance"])

    async def balance(self, of: str) -> int:
        reply = await self.peer.request("balance", {"uid": of}, reply="balance")
        return int(reply["balance"])

    async def register(self, directory_uid: str, limit: float = 60.0) -> str:
        """Run ``Registrant.Register(directory_uid)`` to its end (the
        register call, the funding payment under the AutoFund policy, one
        my_status read); returns its error text, "" on success."""
        reply = await self.peer.request(
            "register", {"directory": directory_uid}, reply="registered", limit=limit
        )
        return str(reply["error"])


@asynccontextmanager
async def go_provider(
    fabric: Fabric,
    binary: Path,
    at: str,
    data_dir: Path,
    *,
    allow: Sequence[str] = (DIRECTORY,),
    price: int = 5_000,
    test_max: int = 20_000,
    description: str = "interop provider",
    tags: Sequence[str] = (),
    autofund: bool = False,
    max_per_request: int = 0,
    max_per_month: int = 0,
    allowed_directories: Sequence[str] = (),
    pay: PayFunc = _refuse,
    args: Sequence[str] = (),
) -> AsyncIterator[GoProvider]:
    """Run the reference provider at ``at``: callers ``allow`` (the
    directory's uid must be among them, or its crawl and its answers to
    the Registrant are dropped), the ``test`` tool at ``price`` atoms,
    nominated with ``test_max`` as ``test.maxAtoms``; AutoFund from
    ``autofund``/``max_per_request``/``max_per_month``/
    ``allowed_directories`` (0 = no cap); ``pay`` settles its funding."""
    await anyio.Path(data_dir).mkdir(parents=True, exist_ok=True)
    asks = _Asks(pay, _accept, _accept)
    argv = [
        str(binary),
        "provider",
        "-datadir",
        str(data_dir),
        "-allow",
        ",".join(allow),
        "-price",
        str(price),
        "-test-max",
        str(test_max),
        "-description",
        description,
        "-tags",
        ",".join(tags),
        f"-autofund={'true' if autofund else 'false'}",
        "-max-per-request",
        str(max_per_request),
        "-max-per-month",
        str(max_per_month),
        "-allowed-dirs",
        ",".join(allowed_directories),
        *args,
    ]
    async with PipePeer(fabric, at, argv, handlers=asks.handlers()) as peer:
        asks.peer.append(peer)
        await peer.next("ready")
        yield GoProvider(peer, at, data_dir, asks)


def go_autofund_provider(
    fabric: Fabric,
    binary: Path,
    data_dir: Path,
    directories: Sequence[str],
    *,
    price: int,
    test_max: int,
    pay: PayFunc,
    max_per_request: int = 0,
    args: Sequence[str] = (),
) -> AbstractAsyncContextManager[GoProvider]:
    """The reference provider at :data:`PROVIDER` tagged ``go``, callable
    by ``directories`` and funding its listings there under AutoFund (at
    most ``max_per_request`` atoms a request, 0 = no cap; no monthly cap);
    the other arguments as for :func:`go_provider`."""
    return go_provider(
        fabric,
        binary,
        PROVIDER,
        data_dir,
        allow=directories,
        price=price,
        test_max=test_max,
        tags=["go"],
        autofund=True,
        max_per_request=max_per_request,
        allowed_directories=directories,
        pay=pay,
        args=args,
    )


def add_probe_tools(harness: Harness, runs: list[dict[str, Any]], *, price_atoms: int) -> None:
    """Give a Python provider ``harness`` the tools of the reference
    provider (:func:`go_provider`): ``test`` at ``price_atoms`` atoms, the
    one a directory nominates for its paid test call (its arguments are
    appended to ``runs``; it answers ``{"ok": true, "text"}``), and a free
    ``echo`` (``{"echo"}``). Both take ``{"text"}``."""

    async def test_tool(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        runs.append(args)
        return {"ok": True, "text": args.get("text", "")}

    async def echo(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"echo": args.get("text", "")}

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    harness.add_tool(
        "test",
        test_tool,
        description="A priced verification probe.",
        input_schema=schema,
        price_atoms=price_atoms,
    )
    harness.add_tool("echo", echo, description="Echo the text back.", input_schema=schema)
