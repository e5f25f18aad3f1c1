"""What one logical call's money looks like to its agent (BRIDGE.md §The
hard bound, "Money is visible"; §Failures): the note a result carries after
atoms moved, and the words of the errors that say what was paid.
"""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult, TextContent

from brmcp.protocol.payment import BALANCE_ATOMS_KEY, PAID_ATOMS_KEY, REFUNDED_ATOMS_KEY, Receipt

from ._budget import CallBudget
from ._shares import Payment

__all__ = ["already", "charged", "refunded", "spent", "with_money"]


def with_money(
    name: str,
    result: CallToolResult,
    budget: CallBudget,
    ahead: Payment | None,
    receipt: Receipt | None,
    refunded: tuple[int, int] | None,
) -> CallToolResult:
    """``result`` with what moved for this call told to the agent
    (BRIDGE.md §The hard bound, "Money is visible"): one text item
    ``<name>: paid N atoms to the bot for this call; the bot charged C
    atoms; your credit at the bot: B atoms`` (the parts that apply), and
    the ``_meta`` key ``brmcp/paidAtoms`` when this bridge paid for the
    call; the bot's receipt and refund keys stay. ``name`` is the bridge's
    name (the note's prefix). Unchanged when no atom moved."""
    paid, _ = spent(budget, ahead)
    pending = ahead is not None and not ahead.done
    charged = receipt.charged_atoms if receipt is not None else 0
    refund = refunded[0] if refunded is not None else 0
    if not (paid or pending or charged or refund):
        return result
    parts: list[str] = []
    if paid:
        parts.append(f"paid {paid} atoms to the bot for this call")
    if pending and ahead is not None:
        parts.append(f"a payment of {ahead.amount} atoms made alongside is being confirmed")
    if charged:
        parts.append(f"the bot charged {charged} atoms")
    if refund:
        parts.append(f"the call failed and the bot refunded {refund} atoms")
    if receipt is not None:
        parts.append(f"your credit at the bot: {receipt.balance_atoms} atoms")
    elif refunded is not None:
        parts.append(f"your credit at the bot: {refunded[1]} atoms")
    elif paid:
        parts.append("what the bot did not charge stays there as credit for later calls")
    note = TextContent(type="text", text=f"{name}: " + "; ".join(parts))
    update: dict[str, Any] = {"content": [*result.content, note]}
    if paid:
        update["meta"] = {**dict(result.meta or {}), PAID_ATOMS_KEY: paid}
    return result.model_copy(update=update)


def spent(budget: CallBudget, ahead: Payment | None) -> tuple[int, int]:
    """``(atoms, payments)`` made for a call so far: those counted in its
    budget plus a confirmed payment made alongside not counted yet."""
    if ahead is not None and ahead.confirmed:
        return budget.paid_atoms + ahead.amount, budget.payments + 1
    return budget.paid_atoms, budget.payments


def already(budget: CallBudget) -> str:
    """The suffix of a refusal note for a call that already paid."""
    return f" (already paid {budget.paid_atoms} atoms for this call; that credit stays at the bot)"


def refunded(meta: Any) -> tuple[int, int] | None:
    """``(refunded atoms, balance after the refund)`` from a result's
    ``_meta`` (``brmcp/refundedAtoms`` and ``brmcp/balanceAtoms``, WIRE.md
    §Receipts), or None when either is missing or not a whole number ≥ 0."""
    if not isinstance(meta, dict):
        return None
    refunded, balance = _whole(meta.get(REFUNDED_ATOMS_KEY)), _whole(meta.get(BALANCE_ATOMS_KEY))
    if refunded is None or balance is None:
        return None
    return refunded, balance


def _whole(value: Any) -> int | None:
    """``value`` when it is a JSON integer ≥ 0, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def charged(paid_atoms: int, payments: int) -> str:
    """What a failed call cost, for the agent's error message."""
    if payments == 0:
        return "nothing was paid for this call"
    return (
        f"paid {paid_atoms} atoms for this call ({payments} payment(s)); credit the bot did not use"
        " stays there for later calls"
    )
