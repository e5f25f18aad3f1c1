"""What a ``brmcp demo`` run is asked to do (:class:`DemoOptions`), the
demo's constants, its one error type, and the checks made before anything
starts (the bridge's port)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEMO_PER_CALL_CAP",
    "DEMO_PER_DAY_CAP",
    "ECHO_TEXT",
    "NO_GO",
    "STEPS",
    "DemoError",
    "DemoOptions",
    "check_port",
    "step_timeout",
]

#: Spending policy of the demo's bridge, in atoms (1 DCR = 100,000,000 atoms).
DEMO_PER_CALL_CAP = 20_000
DEMO_PER_DAY_CAP = 100_000
#: The text the agent sends to ``echo``.
ECHO_TEXT = "hello over Bison Relay"
#: Steps in the transcript (``[n/8]``).
STEPS = 8
#: Why ``--network real`` cannot run without Go (one line; brnet, the real
#: network, is a Go program built on first use).
NO_GO = (
    "--network real needs Go >= 1.22 to build brnet, the real Bison Relay network: install Go from "
    "https://go.dev/dl/ (or your package manager) so that 'go' is on PATH; plain 'brmcp demo' needs no Go"
)


class DemoError(Exception):
    """A demo step failed; the message names the step and the reason."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """``latency_ms``: per-PM relay latency in milliseconds (with 20 %
    jitter), to feel a real relay. ``port``: the bridge's loopback port (0
    picks a free one). ``datadir``: keep every file there instead of a
    temporary directory (removed at the end). ``keep_running``: after the
    transcript, leave the network and bridge up and print how to connect
    other agents. ``step_timeout``: seconds any one step may take (None:
    60 s plus 20 times the latency). ``network``: ``"fake"`` (the in-memory
    relay and fake brclients) or ``"real"`` (brnet: a real bisonrelay relay
    and real clients on loopback, built with Go on first use; ``latency_ms``
    is then added one way to every message a client sends to the relay)."""

    latency_ms: float = 0.0
    network: str = "fake"
    port: int = 0
    datadir: Path | None = None
    keep_running: bool = False
    step_timeout: float | None = None


def step_timeout(options: DemoOptions) -> float:
    """Seconds any one step may take: ``options.step_timeout``, else 60 s
    plus 20 times the latency."""
    if options.step_timeout is not None:
        return options.step_timeout
    return 60.0 + 20 * options.latency_ms / 1000.0


def check_port(port: int) -> None:
    """Raise :class:`DemoError` (one line naming the address) when the
    bridge's ``127.0.0.1:port`` cannot be bound now; port 0 always passes."""
    from ..metrics.endpoint import cannot_listen, probe_listen

    try:
        probe_listen("127.0.0.1", port)
    except OSError as exc:
        raise DemoError(cannot_listen("127.0.0.1", port, exc, option="--port")) from None
