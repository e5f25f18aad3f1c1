"""Reconnect delays of the clientrpc client (docs/clientrpc.md §Reconnecting:
1 s doubling to 30 s, reset after a successful connection)."""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Reconnect delays: ``initial`` seconds, doubling up to ``maximum``; :meth:`reset`
    after a successful connection (docs/clientrpc.md §Reconnecting: 1 s doubling to 30 s).

    Raises ``ValueError`` when ``initial`` is not > 0; a ``maximum`` below
    ``initial`` is raised to ``initial``."""

    def __init__(self, initial: float = 1.0, maximum: float = 30.0) -> None:
        if initial <= 0:
            raise ValueError("backoff_initial must be > 0 seconds")
        self.initial = initial
        self.maximum = max(maximum, initial)
        self._next = initial

    def next(self) -> float:
        """The delay to wait now, in seconds; the following one doubles (capped)."""
        delay = self._next
        self._next = min(delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        """Start again from ``initial``."""
        self._next = self.initial
