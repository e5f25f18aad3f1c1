"""What both ends agree on above the transport: the ``_meta`` keys and the
JSON shapes of brmcp's payments (:mod:`.payment`; WIRE.md §Payments,
§callKey, §Receipts, §Pay alongside) and of its era extensions
(:mod:`.eras`; WIRE.md §Eras). Pure data and parsing, no I/O: the server
(:mod:`brmcp.server`) writes these shapes and the bridge
(:mod:`brmcp.bridge`) reads them, and both match the Go reference.
"""

from .eras import CAPABILITIES_META_KEY, LIST_TOOLS_KEY, MODERN_VERSIONS_KEY, TOOLS_KEY
from .payment import (
    BALANCE_ATOMS_KEY,
    CALL_KEY,
    CALLER_EPOCH_KEY,
    CHARGED_ATOMS_KEY,
    HELD_KEY,
    MARKS_REFUSALS_KEY,
    PAID_ATOMS_KEY,
    PAY_ALONGSIDE_KEY,
    PAYMENT_REQUIRED,
    PRICE_ATOMS_KEY,
    PRICING_DYNAMIC,
    PRICING_KEY,
    REFUNDED_ATOMS_KEY,
    REFUSAL_KEY,
    TIP_RAIL,
    PaymentRequired,
    Receipt,
    parse_payment_required,
    parse_receipt,
    payment_required_result,
    payment_required_text,
)

__all__ = [
    "BALANCE_ATOMS_KEY",
    "CALLER_EPOCH_KEY",
    "CALL_KEY",
    "CAPABILITIES_META_KEY",
    "CHARGED_ATOMS_KEY",
    "HELD_KEY",
    "LIST_TOOLS_KEY",
    "MARKS_REFUSALS_KEY",
    "MODERN_VERSIONS_KEY",
    "PAID_ATOMS_KEY",
    "PAYMENT_REQUIRED",
    "PAY_ALONGSIDE_KEY",
    "PRICE_ATOMS_KEY",
    "PRICING_DYNAMIC",
    "PRICING_KEY",
    "REFUNDED_ATOMS_KEY",
    "REFUSAL_KEY",
    "TIP_RAIL",
    "TOOLS_KEY",
    "PaymentRequired",
    "Receipt",
    "parse_payment_required",
    "parse_receipt",
    "payment_required_result",
    "payment_required_text",
]
