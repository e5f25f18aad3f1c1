"""The shared test kit.

* :func:`until`: wait for a condition the code under test will make true
  (a counter, a file, a state), failing after ``limit`` seconds; never used
  to wait for something *not* to happen (drive an injected clock for that:
  :class:`brmcp.bridge.ManualClock`, or trio's ``MockClock`` for virtual time);
* the uids every stack uses: :data:`BOT` (the harness), :data:`CLIENT` (the
  bridge's own uid, the caller the bot sees), :data:`ALICE` and :data:`BOB`
  (callers of a harness served directly), :data:`OTHER_BOT`;
* the stacks: :mod:`.harness` (a harness on a fabric), :mod:`.bridge` (a
  harness, a bridge and its HTTP endpoint), :mod:`.transport` (raw MCP
  servers over the transport), :mod:`.clientrpc` (fake brclients),
  :mod:`.serve` (the brmcp-serve app on fakebr), :mod:`.gateway`,
  :mod:`.soak`, :mod:`.ui`; :mod:`.paths` for the repository's files.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable

import anyio

from brmcp import wire
from brmcp.testing import uid

__all__ = [
    "ALICE",
    "BOB",
    "BOT",
    "CLIENT",
    "OTHER_BOT",
    "is_internal_error",
    "pm_messages",
    "pm_parts",
    "until",
]

#: The bot (a harness) in every stack.
BOT = uid(1)
#: The bridge's uid: the caller a bot sees behind a bridge.
CLIENT = uid(2)
#: A caller of a harness served without a bridge (the same uid as CLIENT).
ALICE = CLIENT
#: A second caller of a harness.
BOB = uid(3)
#: A second bot (the same uid as BOB: no stack has both).
OTHER_BOT = BOB


async def until(
    predicate: Callable[[], Awaitable[bool] | bool],
    limit: float = 20.0,
    *,
    state: Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate`` (sync or async) every 5 ms until it is true; fail
    with TimeoutError after ``limit`` seconds, or with AssertionError naming
    ``state()`` (what was true instead) when ``state`` is given."""
    try:
        with anyio.fail_after(limit):
            while True:
                value = predicate()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return
                await anyio.sleep(0.005)
    except TimeoutError:
        if state is None:
            raise
        raise AssertionError(f"not true after {limit} s: {state()}") from None


def pm_parts(text: str) -> list[wire.Part]:
    """The envelope parts one PM carries: its own, or each line of a batch
    PM (WIRE.md §Batches); none for chat."""
    lines = wire.split_batch(text)
    parts = (wire.parse(line) for line in (lines if lines is not None else [text]))
    return [part for part in parts if part is not None]


def pm_messages(text: str) -> list[dict[str, object]]:
    """The single-part JSON-RPC messages (objects) one PM carries."""
    out: list[dict[str, object]] = []
    for part in pm_parts(text):
        if part.total == 1:
            value = json.loads(part.chunk)
            if isinstance(value, dict):
                out.append(value)
    return out


def is_internal_error(tool: str, text: str) -> bool:
    """Whether ``text`` is the short error a peer gets for an unexpected
    exception in ``tool`` (brmcp/protocol/toolerrors.py): the exception's own
    text never leaves the bot, only an 8-hex ref to the operator's log line."""
    return (
        re.fullmatch(
            rf"internal error in tool {re.escape(tool)}; the operator's log has the details"
            r" \(ref [0-9a-f]{8}\)",
            text,
        )
        is not None
    )
