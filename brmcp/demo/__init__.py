"""``brmcp demo``: the whole chain on one machine, with real protocols.

In one process on loopback it starts a simulated Bison Relay network (a fake
relay and two fake brclients, each serving real TLS clientrpc), the
``brmcp-serve`` daemon connected to one brclient over clientrpc, and the
``brmcp-bridge`` daemon connected to the other (autopay, caps set for the
demo). It then acts as a stock MCP agent with the official SDK's
streamable-HTTP client against the bridge endpoint: it lists the tools with
their prices, calls the free ``echo`` and the paid ``fortune``
(pay alongside: the tip and the marked call together → credit → result; or
payment_required → tip → credit → reissue with the same callKey → result),
and prints a transcript: each step, the relay PMs it took, the bot's ledger
and the bridge's spend log. Facts that must hold (one execution, one
charge, consistent books) are checked; any failure names its step.

Modules, one concept each: :mod:`.options` (what a run is asked to do, the
demo's constants and errors), :mod:`.command` (the ``brmcp demo`` command
line), :mod:`.run` (the eight steps and the checks of the books),
:mod:`.fakenet` (the in-process network: fabric, fake relay, fake
brclients), :mod:`.realnet` (the real network: brnet, built with Go) and
:mod:`.transcript` (what is printed).
"""

from .command import demo_main
from .options import (
    DEMO_PER_CALL_CAP,
    DEMO_PER_DAY_CAP,
    ECHO_TEXT,
    NO_GO,
    STEPS,
    DemoError,
    DemoOptions,
)
from .run import DemoReport, run_demo

__all__ = [
    "DEMO_PER_CALL_CAP",
    "DEMO_PER_DAY_CAP",
    "ECHO_TEXT",
    "NO_GO",
    "STEPS",
    "DemoError",
    "DemoOptions",
    "DemoReport",
    "demo_main",
    "run_demo",
]
