"""A paid bot of your own, in one file: copy it, change the tools, run it.

    python mybot.py --conf ~/.mybot/mybot.conf --datadir ~/.mybot --allow <caller uid>

``--conf`` is a bisonbotkit-style file like ``brmcp-serve.conf`` (``brrpcurl``
and the three certificate paths of a running brclient; README "Running a
real bot"). The bot keeps its ledger in ``--datadir`` and serves the callers
given with ``--allow`` (64-hex uids). ``brmcp-serve`` is the same program with
more options (prices in a file, a gateway, reloads); this one uses only the
public API: :class:`brmcp.server.Harness`, :func:`brmcp.server.run_bot` and
:class:`brmcp.clientrpc.Client`.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from brmcp.clientrpc import Client, load_bot_config
from brmcp.server import CallContext, Harness, HarnessConfig, run_bot

FORTUNES = (
    "A patient relay delivers every message in its own time.",
    "The answer you seek is one small tip away.",
)


def build_harness(data_dir: Path | None, allowed: set[str]) -> Harness:
    """The bot: ``hello`` (free) and ``fortune`` (10,000 atoms per call)."""
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers=allowed))

    @harness.tool(description="Say hello to the caller.")
    async def hello(ctx: CallContext) -> dict[str, Any]:
        return {"hello": ctx.peer[:8]}

    @harness.tool(price_atoms=10_000, description="Return a fortune. Paid per call.")
    async def fortune(ctx: CallContext) -> dict[str, Any]:
        return {"fortune": random.choice(FORTUNES)}

    return harness


async def serve(conf: Path, data_dir: Path, allowed: set[str]) -> None:
    """Serve the bot through the brclient ``conf`` names, until cancelled."""
    harness = build_harness(data_dir, allowed)
    async with Client.from_config(load_bot_config(conf)) as client:
        await run_bot(harness, client)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A paid MCP bot on Bison Relay.")
    parser.add_argument("--conf", type=Path, required=True, help="bisonbotkit-style brclient config")
    parser.add_argument("--datadir", type=Path, required=True, help="where the ledger lives")
    parser.add_argument("--allow", action="append", default=[], help="a caller's uid (repeatable)")
    args = parser.parse_args(argv)
    anyio.run(serve, args.conf.expanduser(), args.datadir.expanduser(), {uid.lower() for uid in args.allow})


if __name__ == "__main__":
    main()
