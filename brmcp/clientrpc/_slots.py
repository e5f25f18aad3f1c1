"""The request slots of one clientrpc connection: brclient serves at most 16
requests per connection at once, open streams included (docs/clientrpc.md
§The concurrency limit); a request waits here, in FIFO order, for a free slot."""

from __future__ import annotations

from collections import deque

import anyio

from .errors import ClientrpcNotConnected

__all__ = ["Slots"]


class Slots:
    """``size`` request slots of one connection, handed out in FIFO order.
    :meth:`acquire` raises :class:`ClientrpcNotConnected` once :meth:`close`
    has been called (the connection ended)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self.closed = False
        self._waiters: deque[anyio.Event] = deque()

    @property
    def in_use(self) -> int:
        return self.size - self.free

    async def acquire(self) -> None:
        if self.closed:
            raise ClientrpcNotConnected("brclient connection closed")
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        waiter = anyio.Event()
        self._waiters.append(waiter)
        try:
            await waiter.wait()
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif not self.closed:
                self.release()  # the slot was handed to us as we were cancelled: pass it on
            raise
        if self.closed:
            raise ClientrpcNotConnected("brclient connection closed")

    def release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # hand the slot over directly
        elif self.free < self.size:
            self.free += 1

    def close(self) -> None:
        self.closed = True
        while self._waiters:
            self._waiters.popleft().set()
