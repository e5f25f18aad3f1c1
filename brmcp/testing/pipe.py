"""Attach a subprocess to a :class:`~brmcp.testing.Fabric` as a peer.

The process speaks JSON lines on stdin/stdout (the protocol of
``interop/go``'s ``harness`` and ``bridge`` commands):

* ``{"pm": {"from": UID, "text": T}}`` is written to its stdin for every PM
  the fabric delivers to its uid;
* ``{"pm": {"to": UID, "text": T}}`` on its stdout is sent through the fabric
  from its uid (so faults, limits and counters apply as to any peer);
* any other line is a *control line* ``{KIND: BODY}``: it is recorded in
  :attr:`PipePeer.controls`, handed to a handler registered for ``KIND``
  (run in its own task) and queued for :meth:`PipePeer.next`; a body with an
  ``id`` also completes a pending :meth:`PipePeer.request`.

stderr is drained into :attr:`PipePeer.stderr_tail` (the last lines) and the
``brmcp.testing.pipe`` logger at DEBUG.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .fabric import Fabric

__all__ = ["ControlHandler", "PipePeer", "PipePeerError"]

log = logging.getLogger("brmcp.testing.pipe")

#: A handler for one kind of control line: ``await handler(body)``.
ControlHandler = Callable[[dict[str, Any]], Awaitable[None]]

_MAX_LINE = 64 << 20


class PipePeerError(RuntimeError):
    """The subprocess died, wrote a malformed line, or did not answer in time."""


class PipePeer:
    """A subprocess that is the fabric's endpoint at ``uid``.

    ``argv`` is the command; ``env`` its environment (None: inherit);
    ``handlers`` maps control-line kinds to async handlers. Use as ``async
    with PipePeer(fabric, uid, argv) as peer:`` inside an entered fabric; on
    exit its stdin is closed, it gets ``grace`` seconds to exit, then it is
    killed, and the uid is detached.
    """

    def __init__(
        self,
        fabric: Fabric,
        uid: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        handlers: dict[str, ControlHandler] | None = None,
        grace: float = 5.0,
    ) -> None:
        self.fabric = fabric
        self.uid = uid
        self.argv = list(argv)
        self.env = env
        self.handlers: dict[str, ControlHandler] = dict(handlers or {})
        self.grace = grace
        #: Every control line received, in order, as ``(kind, body)``.
        self.controls: list[tuple[str, dict[str, Any]]] = []
        #: The last lines the process wrote to stderr.
        self.stderr_tail: deque[str] = deque(maxlen=200)
        self._proc: anyio.abc.Process | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._write_lock = anyio.Lock()
        self._queues: dict[
            str, tuple[MemoryObjectSendStream[dict[str, Any]], MemoryObjectReceiveStream[dict[str, Any]]]
        ] = {}
        self._replies: dict[tuple[str, int], tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self._next_id = 0
        self._exited = anyio.Event()

    # -- lifecycle ---------------------------------------------------------------

    async def __aenter__(self) -> PipePeer:
        self._proc = await anyio.open_process(self.argv, env=self.env)
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._read_stdout)
        tg.start_soon(self._read_stderr)
        self.fabric.attach(self.uid, self._deliver)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        self.fabric.detach(self.uid)
        proc = self._proc
        tg = self._tg
        assert proc is not None
        assert tg is not None
        with anyio.CancelScope(shield=True):
            if proc.stdin is not None:
                await proc.stdin.aclose()
            with anyio.move_on_after(self.grace):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)
        with anyio.CancelScope(shield=True):
            await proc.aclose()
        for send, recv in self._queues.values():
            send.close()
            recv.close()
        return None

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has ended, else None."""
        return None if self._proc is None else self._proc.returncode

    # -- traffic -------------------------------------------------------------------

    async def send(self, kind: str, body: dict[str, Any]) -> None:
        """Write the control line ``{kind: body}`` to the process's stdin."""
        await self._write({kind: body})

    async def request(
        self, kind: str, body: dict[str, Any], reply: str, limit: float = 30.0
    ) -> dict[str, Any]:
        """Send ``{kind: {**body, "id": N}}`` and return the body of the first
        ``reply`` line carrying the same id. Raises :class:`PipePeerError`
        after ``limit`` seconds or if the process exits first."""
        self._next_id += 1
        ident = self._next_id
        event = anyio.Event()
        slot: list[dict[str, Any]] = []
        self._replies[(reply, ident)] = (event, slot)
        try:
            await self.send(kind, {**body, "id": ident})
            with anyio.move_on_after(limit):
                await self._wait_either(event)
            if not slot:
                raise PipePeerError(f"{self._name()}: no {reply!r} reply to {kind!r} {ident}{self._tail()}")
            return slot[0]
        finally:
            self._replies.pop((reply, ident), None)

    async def next(self, kind: str, limit: float = 30.0) -> dict[str, Any]:
        """The next not yet consumed control line of ``kind`` (including ones
        that arrived before the call). Raises :class:`PipePeerError` after
        ``limit`` seconds or if the process exits first."""
        _, recv = self._queue(kind)
        result: list[dict[str, Any]] = []

        async def take() -> None:
            result.append(await recv.receive())

        with anyio.move_on_after(limit):
            async with anyio.create_task_group() as tg:

                async def until_exit() -> None:
                    await self._exited.wait()
                    tg.cancel_scope.cancel()

                async def take_then_stop() -> None:
                    await take()
                    tg.cancel_scope.cancel()

                tg.start_soon(until_exit)
                tg.start_soon(take_then_stop)
        if not result:
            raise PipePeerError(f"{self._name()}: no {kind!r} line{self._tail()}")
        return result[0]

    def count(self, kind: str) -> int:
        """How many control lines of ``kind`` arrived so far."""
        return sum(1 for k, _ in self.controls if k == kind)

    # -- internals -------------------------------------------------------------------

    def _name(self) -> str:
        return f"{self.argv[0].rsplit('/', 1)[-1]} {' '.join(self.argv[1:2])} at {self.uid[:8]}"

    def _tail(self) -> str:
        if self._exited.is_set():
            lines = "\n".join(list(self.stderr_tail)[-20:])
            return f" (exited {self.returncode}; stderr:\n{lines})"
        return ""

    async def _wait_either(self, event: anyio.Event) -> None:
        async with anyio.create_task_group() as tg:

            async def on_event() -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            async def on_exit() -> None:
                await self._exited.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(on_event)
            tg.start_soon(on_exit)

    def _queue(
        self, kind: str
    ) -> tuple[MemoryObjectSendStream[dict[str, Any]], MemoryObjectReceiveStream[dict[str, Any]]]:
        pair = self._queues.get(kind)
        if pair is None:
            pair = anyio.create_memory_object_stream[dict[str, Any]](math.inf)
            self._queues[kind] = pair
        return pair

    async def _write(self, obj: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise PipePeerError(f"{self._name()}: not running")
        data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        async with self._write_lock:
            try:
                await proc.stdin.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                raise PipePeerError(f"{self._name()}: stdin closed{self._tail()}") from exc

    async def _deliver(self, from_uid: str, text: str) -> None:
        await self._write({"pm": {"from": from_uid, "text": text}})

    async def _read_stdout(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        reader = BufferedByteReceiveStream(proc.stdout)
        sender = self.fabric.sender(self.uid)
        try:
            while True:
                try:
                    raw = await reader.receive_until(b"\n", _MAX_LINE)
                except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
                    break
                try:
                    line = json.loads(raw)
                except ValueError:
                    log.warning("%s: not a JSON line: %r", self._name(), raw[:200])
                    continue
                if not isinstance(line, dict) or len(line) != 1:
                    log.warning("%s: unexpected line %r", self._name(), raw[:200])
                    continue
                ((kind, body),) = line.items()
                if kind == "pm":
                    try:
                        await sender.send_pm(body["to"], body["text"])
                    except Exception as exc:  # a refused PM is the sender's loss, as on BR
                        log.info("%s: PM to %s not sent: %s", self._name(), str(body.get("to"))[:8], exc)
                    continue
                self._control(kind, body if isinstance(body, dict) else {"value": body})
        finally:
            if proc.returncode is None:
                with anyio.move_on_after(self.grace), anyio.CancelScope(shield=True):
                    await proc.wait()
            self._exited.set()

    def _control(self, kind: str, body: dict[str, Any]) -> None:
        self.controls.append((kind, body))
        ident = body.get("id")
        if isinstance(ident, int):
            waiter = self._replies.get((kind, ident))
            if waiter is not None:
                waiter[1].append(body)
                waiter[0].set()
        handler = self.handlers.get(kind)
        if handler is not None:
            assert self._tg is not None
            self._tg.start_soon(self._run_handler, kind, handler, body)
        self._queue(kind)[0].send_nowait(body)

    async def _run_handler(self, kind: str, handler: ControlHandler, body: dict[str, Any]) -> None:
        try:
            await handler(body)
        except Exception:
            log.exception("%s: %s handler failed", self._name(), kind)

    async def _read_stderr(self) -> None:
        proc = self._proc
        assert proc is not None
        if proc.stderr is None:
            return
        reader = BufferedByteReceiveStream(proc.stderr)
        while True:
            try:
                raw = await reader.receive_until(b"\n", _MAX_LINE)
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
                return
            text = raw.decode(errors="replace")
            self.stderr_tail.append(text)
            log.debug("%s: %s", self._name(), text)
