"""The two example tools (the Go reference's brmcp-serve tools, docs/interop.md; names,
descriptions, schemas and prices are wire-visible data):

* ``echo`` (free): ``{"text": str}`` → ``{"echo": text}``;
* ``fortune`` (10 000 atoms = 0.0001 DCR per call): no input →
  ``{"fortune": <one of five canned strings>}``.
"""

from __future__ import annotations

import random
from typing import Any

from ..server import CallContext, Harness

__all__ = [
    "ECHO_DESCRIPTION",
    "FORTUNES",
    "FORTUNE_DESCRIPTION",
    "FORTUNE_PRICE_ATOMS",
    "register_tools",
]

ECHO_DESCRIPTION = "Echo the provided text back to the caller."
FORTUNE_DESCRIPTION = "Return a fortune. Paid per call."
#: Price of one fortune in atoms (1 DCR = 1e8 atoms).
FORTUNE_PRICE_ATOMS = 10_000

FORTUNES = (
    "A patient relay delivers every message in its own time.",
    "The answer you seek is one small tip away.",
    "Atoms spent wisely add up to good answers.",
    "A call with a key is never paid for twice.",
    "Today is a fine day to read the logs.",
)

# Input schemas as the Go SDK infers them from the reference's input structs
# (go-sdk v1.6.1, jsonschema-go): required fields, no extra properties. No
# output schemas: the reference's handlers return ``any``, from which the Go
# SDK infers none, so its tools/list has no ``outputSchema`` for these tools
# and neither has ours (docs/interop.md). Results still carry
# ``structuredContent`` and its JSON as text.
ECHO_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "the text to echo back"}},
    "required": ["text"],
    "additionalProperties": False,
}
FORTUNE_INPUT_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False}


def register_tools(harness: Harness, rng: random.Random | None = None) -> None:
    """Add ``echo`` and ``fortune`` to ``harness``; ``rng`` picks fortunes
    (default: a fresh :class:`random.Random`)."""
    pick = rng or random.Random()

    async def echo(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"echo": args["text"]}

    async def fortune(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"fortune": pick.choice(FORTUNES)}

    harness.add_tool(
        "echo",
        echo,
        description=ECHO_DESCRIPTION,
        input_schema=ECHO_INPUT_SCHEMA,
    )
    harness.add_tool(
        "fortune",
        fortune,
        description=FORTUNE_DESCRIPTION,
        input_schema=FORTUNE_INPUT_SCHEMA,
        price_atoms=FORTUNE_PRICE_ATOMS,
    )
