"""Payment metadata shared by bots and callers (WIRE.md §Payments, §callKey).

* ``_meta`` keys: :data:`PRICE_ATOMS_KEY` and :data:`PRICING_KEY` on tools in
  ``tools/list``; :data:`CALL_KEY` in ``tools/call`` ``params._meta``.
* The refusal a bot returns for an unfunded paid call: an ``isError`` tool
  result whose text content is the JSON of :class:`PaymentRequired`
  (:func:`payment_required_text` writes it, :func:`parse_payment_required`
  finds it). All amounts are integer atoms.
* A brmcp harness's own refusals are marked (:func:`marked_payment_required_result`,
  :data:`REFUSAL_KEY`) and tool output that would decode as one is defused
  (:func:`defuse_refusal_text`, :data:`NOT_A_REFUSAL_PREFIX`; WIRE.md §Payments,
  "Genuine refusals").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mcp.types import CallToolResult, TextContent

from .._ops import gojson as _gojson

__all__ = [
    "BALANCE_ATOMS_KEY",
    "CALLER_EPOCH_KEY",
    "CALL_KEY",
    "CALL_KEY_MAX_BYTES",
    "CALL_KEY_MIN_BYTES",
    "CHARGED_ATOMS_KEY",
    "HELD_KEY",
    "MARKS_REFUSALS_KEY",
    "NOT_A_REFUSAL_PREFIX",
    "PAID_ATOMS_KEY",
    "PAYMENT_REQUIRED",
    "PAY_ALONGSIDE_KEY",
    "PRICE_ATOMS_KEY",
    "PRICING_DYNAMIC",
    "PRICING_KEY",
    "REFUNDED_ATOMS_KEY",
    "REFUSAL_KEY",
    "RESERVED_META_PREFIX",
    "TIP_RAIL",
    "PaymentRequired",
    "Receipt",
    "caller_epoch",
    "decodes_as_refusal",
    "defuse_refusal_text",
    "marked_payment_required_result",
    "parse_payment_required",
    "parse_receipt",
    "pay_alongside_atoms",
    "payment_required_result",
    "payment_required_text",
    "valid_call_key",
]

#: Tool ``_meta`` key: the per-call price in atoms (``0`` for free tools).
PRICE_ATOMS_KEY = "brmcp/priceAtoms"
#: Tool ``_meta`` key: ``"dynamic"`` when the price depends on the arguments.
PRICING_KEY = "brmcp/pricing"
#: The :data:`PRICING_KEY` value for argument-dependent prices.
PRICING_DYNAMIC = "dynamic"
#: ``tools/call`` ``params._meta`` key carrying the caller's idempotency key.
CALL_KEY = "brmcp/callKey"
#: Result ``_meta`` key of a paid result (a receipt, WIRE.md §Receipts): the
#: atoms this call charged.
CHARGED_ATOMS_KEY = "brmcp/chargedAtoms"
#: Result ``_meta`` key of a paid result: the caller's balance in atoms right
#: after the charge.
BALANCE_ATOMS_KEY = "brmcp/balanceAtoms"
#: ``tools/call`` ``params._meta`` key marking a call whose payment the caller
#: is making alongside it (WIRE.md §Pay alongside): a positive JSON integer,
#: the atoms of the tip in flight.
PAY_ALONGSIDE_KEY = "brmcp/payAlongside"
#: Result ``_meta`` key: ``true`` on the answer to a call the server held
#: until a credit landed (WIRE.md §Pay alongside): its receipt counts that credit.
HELD_KEY = "brmcp/held"
#: Result ``_meta`` key a brmcp harness puts on its own ``payment_required``
#: refusals (value ``true``; WIRE.md §Payments, "Genuine refusals"). A
#: handler's or an upstream's output never carries it: the harness strips
#: every reserved ``brmcp/`` result key from tool output before adding its own.
REFUSAL_KEY = "brmcp/refusal"
#: ``tools/list`` result ``_meta`` key (value ``true``) by which a harness
#: says that it marks its genuine refusals with :data:`REFUSAL_KEY`: a caller
#: that saw it takes an unmarked refusal-shaped result from that bot as tool
#: output, never as a request for money.
MARKS_REFUSALS_KEY = "brmcp/marksRefusals"
#: Result ``_meta`` key of a failed paid call the harness refunded: the atoms
#: credited back, beside :data:`BALANCE_ATOMS_KEY` (the balance after the
#: refund), so the caller can tell its agent the credit stays at the bot.
REFUNDED_ATOMS_KEY = "brmcp/refundedAtoms"
#: Result ``_meta`` key a brmcp bridge adds for its agent: the atoms the
#: bridge paid to the bot for this logical call (a JSON integer > 0; absent
#: when it paid nothing). Not part of the wire between peers.
PAID_ATOMS_KEY = "brmcp/paidAtoms"
#: ``tools/call`` ``params._meta`` key: a random token a caller mints once per
#: process start (16 lowercase hex). A harness that sees a caller's token
#: change drops that caller's held calls uncharged: the process that sent
#: them is gone and nobody would receive their results (WIRE.md §Pay alongside).
CALLER_EPOCH_KEY = "brmcp/callerEpoch"
#: Inclusive bounds on a honoured callKey's length in UTF-8 bytes (WIRE.md §callKey).
CALL_KEY_MIN_BYTES = 8
CALL_KEY_MAX_BYTES = 128
#: The ``error`` value of a payment refusal.
PAYMENT_REQUIRED = "payment_required"
#: The only payment rail (BR tips); ``acceptedRails`` is always ``["tip"]``.
TIP_RAIL = "tip"

_FIELDS: dict[str, _gojson.Kind] = {
    "error": "string",
    "tool": "string",
    "priceAtoms": "int64",
    "balanceAtoms": "int64",
    "shortfallAtoms": "int64",
    "acceptedRails": "strings",
}


@dataclass(frozen=True, slots=True)
class PaymentRequired:
    """A bot's ``payment_required`` refusal (WIRE.md §Payments).

    ``price_atoms`` is the tool's price, ``balance_atoms`` the caller's
    prepaid balance when the debit failed and ``shortfall_atoms`` the
    difference; all in atoms. ``accepted_rails`` is ``("tip",)`` from every
    conforming bot.
    """

    error: str = PAYMENT_REQUIRED
    tool: str = ""
    price_atoms: int = 0
    balance_atoms: int = 0
    shortfall_atoms: int = 0
    accepted_rails: tuple[str, ...] = (TIP_RAIL,)

    def to_json(self) -> str:
        """The compact JSON text, keys in the Go struct order, as Go's
        ``json.Marshal`` writes it (an empty rail list is ``null``)."""
        return _gojson.dumps(
            {
                "error": self.error,
                "tool": self.tool,
                "priceAtoms": self.price_atoms,
                "balanceAtoms": self.balance_atoms,
                "shortfallAtoms": self.shortfall_atoms,
                "acceptedRails": list(self.accepted_rails) if self.accepted_rails else None,
            }
        )


def payment_required_text(
    tool: str, price_atoms: int, balance_atoms: int, shortfall_atoms: int | None = None
) -> str:
    """The refusal text a bot sends when ``balance_atoms`` cannot cover
    ``price_atoms``, byte-identical to the Go harness (WIRE.md §Payments:
    the refusal, and step 4 of the server order), e.g.
    ``{"error":"payment_required","tool":"fortune","priceAtoms":10000,
    "balanceAtoms":0,"shortfallAtoms":10000,"acceptedRails":["tip"]}``. ``shortfall_atoms`` defaults to
    ``price_atoms - balance_atoms``. All amounts in atoms."""
    if shortfall_atoms is None:
        shortfall_atoms = price_atoms - balance_atoms
    return PaymentRequired(
        tool=tool,
        price_atoms=price_atoms,
        balance_atoms=balance_atoms,
        shortfall_atoms=shortfall_atoms,
    ).to_json()


def payment_required_result(tool: str, price_atoms: int, balance_atoms: int) -> CallToolResult:
    """The whole refusal: ``isError`` with the JSON of
    :func:`payment_required_text` as its single text content and no
    ``structuredContent`` (WIRE.md §Payments)."""
    text = payment_required_text(tool, price_atoms, balance_atoms)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


#: The ``error`` value as a JSON string token written without escapes.
_PAYMENT_REQUIRED_TOKEN = f'"{PAYMENT_REQUIRED}"'


def _decode(text: str) -> PaymentRequired | None:
    # A refusal has the string "payment_required" as a value. A text without
    # a backslash has no escapes, so that value can only be written as this
    # literal token: without it, nothing in the text decodes as a refusal
    # (the fast answer for almost every tool output).
    if _PAYMENT_REQUIRED_TOKEN not in text and "\\" not in text:
        return None
    try:
        fields = _gojson.decode_struct(_gojson.loads(text), _FIELDS, struct="payment_required fields")
    except _gojson.GoJSONError:
        return None
    if fields.get("error") != PAYMENT_REQUIRED:
        return None
    rails: Sequence[str] = fields.get("acceptedRails", ())
    return PaymentRequired(
        error=PAYMENT_REQUIRED,
        tool=fields.get("tool", ""),
        price_atoms=fields.get("priceAtoms", 0),
        balance_atoms=fields.get("balanceAtoms", 0),
        shortfall_atoms=fields.get("shortfallAtoms", 0),
        accepted_rails=tuple(rails),
    )


def parse_payment_required(result: CallToolResult | None) -> PaymentRequired | None:
    """Find a payment refusal in a tool result (WIRE.md §Payments,
    "Recognising a refusal").

    Returns None unless ``result`` is an ``isError`` result; then the first
    text content, in order, whose text decodes (with Go's rules: keys
    case-insensitive, unknown keys ignored, a non-integer amount or a wrong
    type means "does not decode") into the refusal shape with ``error ==
    "payment_required"``. Other texts may come before it. Never raises for
    bad content.
    """
    if result is None or not result.is_error:
        return None
    for item in result.content:
        if isinstance(item, TextContent):
            found = _decode(item.text)
            if found is not None:
                return found
    return None


def valid_call_key(value: Any) -> bool:
    """True when ``value`` is a callKey a bot honours: a string of 8..128
    UTF-8 bytes (WIRE.md §callKey); anything else runs the call unkeyed."""
    if not isinstance(value, str):
        return False
    size = len(value.encode("utf-8", "surrogatepass"))
    return CALL_KEY_MIN_BYTES <= size <= CALL_KEY_MAX_BYTES


@dataclass(frozen=True, slots=True)
class Receipt:
    """The receipt ``_meta`` of a paid result (WIRE.md §Receipts):
    ``charged_atoms`` the price charged for this call, ``balance_atoms`` the
    caller's balance right after the charge (both atoms)."""

    charged_atoms: int
    balance_atoms: int

    def to_meta(self) -> dict[str, int]:
        """The two ``_meta`` keys with their integer values."""
        return {CHARGED_ATOMS_KEY: self.charged_atoms, BALANCE_ATOMS_KEY: self.balance_atoms}


def _int_value(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)  # Go clients and some JSON stacks write whole floats
    return None


def parse_receipt(meta: Any) -> Receipt | None:
    """The receipt in a result's ``_meta`` (a dict), or None when either key
    is missing or not a whole number of atoms >= 0. Never raises."""
    if not isinstance(meta, dict):
        return None
    charged = _int_value(meta.get(CHARGED_ATOMS_KEY))
    balance = _int_value(meta.get(BALANCE_ATOMS_KEY))
    if charged is None or balance is None or charged < 0 or balance < 0:
        return None
    return Receipt(charged_atoms=charged, balance_atoms=balance)


def pay_alongside_atoms(meta: Any) -> int:
    """The atoms a ``tools/call`` ``_meta`` (a dict) says are being tipped
    alongside the call (:data:`PAY_ALONGSIDE_KEY`); 0 when absent or not a
    positive JSON integer (the mark is then ignored, WIRE.md §Pay alongside)."""
    if not isinstance(meta, dict):
        return 0
    value = meta.get(PAY_ALONGSIDE_KEY)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value >= 1 << 63:
        return 0
    return value


#: The fixed text a brmcp harness puts before a text item of tool output
#: that would otherwise decode as a ``payment_required`` refusal (WIRE.md
#: §Payments, "Genuine refusals"): no JSON decoder accepts the result, so
#: no caller of any era takes tool output for a request for money.
NOT_A_REFUSAL_PREFIX = "tool output (not a payment request): "
#: The namespace of result ``_meta`` keys only a brmcp harness writes
#: (receipts, refusal and refund marks, WIRE.md §Receipts, §Payments); a
#: harness removes every key in it from tool output before adding its own.
RESERVED_META_PREFIX = "brmcp/"


def decodes_as_refusal(text: str) -> bool:
    """True when ``text``, one text content item, decodes as a
    ``payment_required`` refusal under the rules of
    :func:`parse_payment_required` (WIRE.md §Payments, "Recognising a
    refusal"), whatever the result's ``isError``. Never raises."""
    return _decode(text) is not None


def defuse_refusal_text(text: str) -> str:
    """``text`` unchanged unless it :func:`decodes_as_refusal`; then
    :data:`NOT_A_REFUSAL_PREFIX` followed by ``text``, which no JSON decoder
    accepts (WIRE.md §Payments, "Genuine refusals")."""
    return NOT_A_REFUSAL_PREFIX + text if decodes_as_refusal(text) else text


def marked_payment_required_result(tool: str, price_atoms: int, balance_atoms: int) -> CallToolResult:
    """A brmcp harness's own refusal: :func:`payment_required_result` (text
    byte-identical to the Go harness) plus the result ``_meta``
    ``{"brmcp/refusal": true}`` (:data:`REFUSAL_KEY`; WIRE.md §Payments,
    "Genuine refusals"). :func:`payment_required_result` stays the unmarked
    form a Go harness sends."""
    result = payment_required_result(tool, price_atoms, balance_atoms)
    return result.model_copy(update={"meta": {REFUSAL_KEY: True}})


def caller_epoch(meta: Any) -> str | None:
    """The :data:`CALLER_EPOCH_KEY` of a ``tools/call`` ``params._meta`` (a
    dict) when it is a string of 8..128 UTF-8 bytes, the callKey bounds;
    None otherwise (absent or malformed: the call is treated as carrying no
    epoch, WIRE.md §Pay alongside)."""
    if not isinstance(meta, dict):
        return None
    value = meta.get(CALLER_EPOCH_KEY)
    return value if valid_call_key(value) else None
