"""The directory's JSON shapes: tool inputs and outputs, as Go and Python
peers exchange them (docs/directory.md §Tools; karamble/brmcp,
``directory/types.go``).

Every output class has ``to_json()`` giving a dict in the Go struct's key
order with Go's ``omitempty`` applied, so a Go client decodes it and a test
can compare bytes; every input class has ``from_json(value)`` that accepts
what Go's decoder accepts for the shape (unknown keys ignored, ``null``
leaves the default, exact key first then case-insensitive) and raises
:class:`ShapeError` with a one-line message naming the field otherwise.
Amounts are atoms (int); times are unix seconds (int).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_DESCRIPTION_LEN",
    "MAX_SEARCH_HITS",
    "MAX_TAGS",
    "MAX_TAG_LEN",
    "STATES",
    "STATE_AWAITING_FUNDING",
    "STATE_CRAWLING",
    "STATE_LISTED",
    "STATE_NONE",
    "STATE_PENDING_REVIEW",
    "STATE_REJECTED",
    "STATE_TESTING",
    "CategoriesOut",
    "IntroduceIn",
    "IntroduceOut",
    "InviteIn",
    "InviteOut",
    "PolicyOut",
    "ProviderIn",
    "ProviderOut",
    "RegisterIn",
    "SearchHit",
    "SearchIn",
    "SearchOut",
    "ShapeError",
    "StatusOut",
    "TestSpec",
    "go_lower",
    "go_trim_space",
    "normalize_tags",
    "validate_register",
]

#: Largest ``description`` accepted by ``register``, in UTF-8 bytes as sent (Go's ``len``).
MAX_DESCRIPTION_LEN = 1024
#: Most tags one registration carries.
MAX_TAGS = 16
#: Longest tag, in UTF-8 bytes.
MAX_TAG_LEN = 32
#: Most hits one ``search`` answer carries (``total`` counts all).
MAX_SEARCH_HITS = 50

STATE_NONE = "none"
STATE_AWAITING_FUNDING = "awaiting_funding"
STATE_CRAWLING = "crawling"
STATE_TESTING = "testing"
STATE_PENDING_REVIEW = "pending_review"
STATE_LISTED = "listed"
STATE_REJECTED = "rejected"
#: Every state a ``StatusOut`` may report, in pipeline order.
STATES = (
    STATE_NONE,
    STATE_AWAITING_FUNDING,
    STATE_CRAWLING,
    STATE_TESTING,
    STATE_PENDING_REVIEW,
    STATE_LISTED,
    STATE_REJECTED,
)

_INT64_MAX = (1 << 63) - 1


class ShapeError(ValueError):
    """A tool input or a peer's output that does not decode into its shape;
    the message names the shape and the field."""


def _lookup(value: Mapping[str, Any], key: str) -> Any:
    """Go's key matching: the exact key, else the first case-insensitive match."""
    if key in value:
        return value[key]
    folded = key.casefold()
    for name, item in value.items():
        if isinstance(name, str) and name.casefold() == folded:
            return item
    return None


def _object(value: Any, shape: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ShapeError(f"{shape}: expected a JSON object, got {type(value).__name__}")
    return value


def _str(value: Mapping[str, Any], key: str, shape: str) -> str:
    item = _lookup(value, key)
    if item is None:
        return ""
    if not isinstance(item, str):
        raise ShapeError(f"{shape}.{key}: expected a string, got {type(item).__name__}")
    return item


def _int(value: Mapping[str, Any], key: str, shape: str) -> int:
    item = _lookup(value, key)
    if item is None:
        return 0
    if isinstance(item, bool) or not isinstance(item, int | float):
        raise ShapeError(f"{shape}.{key}: expected a whole number, got {type(item).__name__}")
    if isinstance(item, float):
        if not item.is_integer():
            raise ShapeError(f"{shape}.{key}: expected a whole number, got {item!r}")
        item = int(item)
    if not -_INT64_MAX - 1 <= item <= _INT64_MAX:
        raise ShapeError(f"{shape}.{key}: {item} does not fit a signed 64-bit integer")
    return int(item)


def _bool(value: Mapping[str, Any], key: str, shape: str) -> bool:
    item = _lookup(value, key)
    if item is None:
        return False
    if not isinstance(item, bool):
        raise ShapeError(f"{shape}.{key}: expected true or false, got {type(item).__name__}")
    return item


def _strs(value: Mapping[str, Any], key: str, shape: str) -> tuple[str, ...]:
    item = _lookup(value, key)
    if item is None:
        return ()
    if not isinstance(item, list) or not all(isinstance(s, str) for s in item):
        raise ShapeError(f"{shape}.{key}: expected a list of strings")
    return tuple(item)


def _omit(pairs: list[tuple[str, Any]], keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Go's ``omitempty``: drop zero values except for keys in ``keep``."""
    return {k: v for k, v in pairs if k in keep or v not in (0, "", None, [], {}, False)}


@dataclass(frozen=True, slots=True)
class TestSpec:
    """The paid call a directory makes to verify a provider: ``tool`` with
    ``args`` (a JSON object), costing at most ``max_atoms``."""

    __test__ = False  # not a pytest class

    tool: str = ""
    args: dict[str, Any] | None = None
    max_atoms: int = 0

    @classmethod
    def from_json(cls, value: Any) -> TestSpec:
        obj = _object(value, "test")
        args = _lookup(obj, "args")
        if args is not None and not isinstance(args, Mapping):
            raise ShapeError("test.args: expected a JSON object")
        return cls(
            tool=_str(obj, "tool", "test"),
            args=dict(args) if args is not None else None,
            max_atoms=_int(obj, "maxAtoms", "test"),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.tool}
        if self.args:
            out["args"] = dict(self.args)
        out["maxAtoms"] = self.max_atoms
        return out


@dataclass(frozen=True, slots=True)
class RegisterIn:
    """``register``'s input. The caller's uid is the registered identity;
    nothing here names it."""

    description: str = ""
    tags: tuple[str, ...] = ()
    test: TestSpec = field(default_factory=TestSpec)

    @classmethod
    def from_json(cls, value: Any) -> RegisterIn:
        obj = _object(value, "register")
        return cls(
            description=_str(obj, "description", "register"),
            tags=_strs(obj, "tags", "register"),
            test=TestSpec.from_json(_lookup(obj, "test")),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"description": self.description}
        if self.tags:
            out["tags"] = list(self.tags)
        out["test"] = self.test.to_json()
        return out


#: The characters Go's ``unicode.IsSpace`` accepts (``strings.TrimSpace``):
#: Python's ``str.strip()`` also strips U+001C..U+001F, which Go keeps.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000")
)


def go_trim_space(text: str) -> str:
    """``text`` without leading and trailing white space as Go's
    ``strings.TrimSpace`` defines it (``unicode.IsSpace``)."""
    return text.strip(_GO_SPACE)


def go_lower(text: str) -> str:
    """``text`` lowercased as Go's ``strings.ToLower``: one code point at a
    time with the simple case mapping, so U+0130 becomes ``"i"`` (Python:
    two code points) and a word-final capital sigma the medial small sigma
    U+03C3 (Python: the final form U+03C2).
    Tags folded this way match those of a Go directory byte for byte."""
    return "".join("i" if char == "\u0130" else char.lower() for char in text)


def normalize_tags(tags: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Tags trimmed and lowercased as Go does (:func:`go_trim_space`,
    :func:`go_lower`; karamble/brmcp, ``directory/pipeline.go``
    ``normalizeTags``) and de-duplicated, first occurrence first; empty
    tags dropped."""
    seen: dict[str, None] = {}
    for tag in tags:
        clean = go_lower(go_trim_space(tag))
        if clean:
            seen.setdefault(clean, None)
    return tuple(seen)


def validate_register(reg: RegisterIn, budget_max_atoms: int) -> RegisterIn:
    """``reg`` with its tags normalized (:func:`normalize_tags`), or
    ValueError naming the field in the Go reference's words (a Go client
    shows the same refusal). Checked on the input as sent, as the Go
    reference does (karamble/brmcp, ``directory/pipeline.go``): the
    description must not be blank and is at most :data:`MAX_DESCRIPTION_LEN`
    UTF-8 bytes; at most :data:`MAX_TAGS` tags, each 1..:data:`MAX_TAG_LEN`
    bytes; ``test.tool`` is required; ``0 < test.maxAtoms <=
    budget_max_atoms`` (the policy's ``test_budget_max_atoms``)."""
    if not go_trim_space(reg.description):
        raise ValueError("description is required")
    if len(reg.description.encode()) > MAX_DESCRIPTION_LEN:
        raise ValueError(f"description exceeds {MAX_DESCRIPTION_LEN} characters")
    if len(reg.tags) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags")
    for tag in reg.tags:
        if not tag or len(tag.encode()) > MAX_TAG_LEN:
            raise ValueError(f"tags must be 1-{MAX_TAG_LEN} characters")
    if not go_trim_space(reg.test.tool):
        raise ValueError("test.tool is required")
    if reg.test.max_atoms <= 0:
        raise ValueError("test.maxAtoms must be positive")
    if reg.test.max_atoms > budget_max_atoms:
        raise ValueError(f"test.maxAtoms exceeds the directory's {budget_max_atoms} atom ceiling")
    return RegisterIn(description=reg.description, tags=normalize_tags(reg.tags), test=reg.test)


@dataclass(frozen=True, slots=True)
class StatusOut:
    """A caller's pipeline state (``register`` and ``my_status``). After
    ``register`` it is the funding invoice: ``required_atoms`` is what the
    caller's balance must reach before verification starts."""

    state: str = STATE_NONE
    required_atoms: int = 0
    balance_atoms: int = 0
    shortfall_atoms: int = 0
    fee_atoms: int = 0
    test_budget_atoms: int = 0
    expires_at: int = 0
    note: str = ""

    @classmethod
    def from_json(cls, value: Any) -> StatusOut:
        obj = _object(value, "status")
        return cls(
            state=_str(obj, "state", "status"),
            required_atoms=_int(obj, "requiredAtoms", "status"),
            balance_atoms=_int(obj, "balanceAtoms", "status"),
            shortfall_atoms=_int(obj, "shortfallAtoms", "status"),
            fee_atoms=_int(obj, "feeAtoms", "status"),
            test_budget_atoms=_int(obj, "testBudgetAtoms", "status"),
            expires_at=_int(obj, "expiresAt", "status"),
            note=_str(obj, "note", "status"),
        )

    def to_json(self) -> dict[str, Any]:
        return _omit(
            [
                ("state", self.state),
                ("requiredAtoms", self.required_atoms),
                ("balanceAtoms", self.balance_atoms),
                ("shortfallAtoms", self.shortfall_atoms),
                ("feeAtoms", self.fee_atoms),
                ("testBudgetAtoms", self.test_budget_atoms),
                ("expiresAt", self.expires_at),
                ("note", self.note),
            ],
            keep=frozenset({"state"}),
        )


@dataclass(frozen=True, slots=True)
class InviteIn:
    """``listing_invite``'s input (served by a provider's Registrant); the
    caller's uid is the inviting directory."""

    directory: str = ""
    listing_fee_atoms: int = 0
    note: str = ""

    @classmethod
    def from_json(cls, value: Any) -> InviteIn:
        obj = _object(value, "listing_invite")
        return cls(
            directory=_str(obj, "directory", "listing_invite"),
            listing_fee_atoms=_int(obj, "listingFeeAtoms", "listing_invite"),
            note=_str(obj, "note", "listing_invite"),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"directory": self.directory, "listingFeeAtoms": self.listing_fee_atoms}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True, slots=True)
class InviteOut:
    """``listing_invite``'s answer: ``accepted`` means the provider registers
    back at the calling directory, asynchronously."""

    accepted: bool = False
    note: str = ""

    @classmethod
    def from_json(cls, value: Any) -> InviteOut:
        obj = _object(value, "listing_invite result")
        return cls(
            accepted=_bool(obj, "accepted", "listing_invite result"),
            note=_str(obj, "note", "listing_invite result"),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accepted": self.accepted}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True, slots=True)
class IntroduceIn:
    """``introduce``'s input: the listed provider's uid."""

    uid: str = ""

    @classmethod
    def from_json(cls, value: Any) -> IntroduceIn:
        return cls(uid=_str(_object(value, "introduce"), "uid", "introduce"))


@dataclass(frozen=True, slots=True)
class IntroduceOut:
    """``introduce``'s answer: the KX suggestion was sent (the caller's
    client still decides whether to accept it)."""

    suggested: bool = False
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"suggested": self.suggested}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True, slots=True)
class SearchIn:
    """``search``'s input: ``query`` matches tool names and descriptions
    case-insensitively, every tag in ``tags`` must be on the listing,
    ``max_price_atoms`` > 0 drops tools listed above it and dynamically
    priced tools."""

    query: str = ""
    tags: tuple[str, ...] = ()
    max_price_atoms: int = 0

    @classmethod
    def from_json(cls, value: Any) -> SearchIn:
        obj = _object(value, "search")
        return cls(
            query=_str(obj, "query", "search"),
            tags=_strs(obj, "tags", "search"),
            max_price_atoms=_int(obj, "maxPriceAtoms", "search"),
        )

    def to_json(self) -> dict[str, Any]:
        return _omit(
            [("query", self.query), ("tags", list(self.tags)), ("maxPriceAtoms", self.max_price_atoms)]
        )


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One matching tool on one listed provider; ``price_atoms`` and
    ``pricing`` are the listing's advertised price (advisory)."""

    provider_uid: str
    tool: str
    description: str = ""
    price_atoms: int = 0
    pricing: str = ""
    tags: tuple[str, ...] = ()
    catalog_checked_at: int = 0
    last_verified_execution: int = 0

    def to_json(self) -> dict[str, Any]:
        return _omit(
            [
                ("providerUid", self.provider_uid),
                ("tool", self.tool),
                ("description", self.description),
                ("priceAtoms", self.price_atoms),
                ("pricing", self.pricing),
                ("tags", list(self.tags)),
                ("catalogCheckedAt", self.catalog_checked_at),
                ("lastVerifiedExecution", self.last_verified_execution),
            ],
            keep=frozenset({"providerUid", "tool", "catalogCheckedAt", "lastVerifiedExecution"}),
        )


@dataclass(frozen=True, slots=True)
class SearchOut:
    """``search``'s answer: at most :data:`MAX_SEARCH_HITS` hits; ``total``
    is the uncapped count."""

    hits: tuple[SearchHit, ...] = ()
    total: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"hits": [h.to_json() for h in self.hits], "total": self.total}


@dataclass(frozen=True, slots=True)
class ProviderIn:
    """``get_provider``'s input."""

    uid: str = ""

    @classmethod
    def from_json(cls, value: Any) -> ProviderIn:
        return cls(uid=_str(_object(value, "get_provider"), "uid", "get_provider"))


@dataclass(frozen=True, slots=True)
class ProviderOut:
    """One listing: ``catalog`` is the crawled ``tools/list`` tools array
    verbatim (parsed JSON), with the freshness stamps."""

    uid: str
    description: str
    catalog: Any
    tags: tuple[str, ...] = ()
    catalog_checked_at: int = 0
    last_verified_execution: int = 0
    test_latency_ms: int = 0
    approved_at: int = 0
    renewed_at: int = 0
    expires_at: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uid": self.uid, "description": self.description}
        if self.tags:
            out["tags"] = list(self.tags)
        out["catalog"] = self.catalog
        out["catalogCheckedAt"] = self.catalog_checked_at
        out["lastVerifiedExecution"] = self.last_verified_execution
        out["testLatencyMs"] = self.test_latency_ms
        out["approvedAt"] = self.approved_at
        if self.renewed_at:
            out["renewedAt"] = self.renewed_at
        out["expiresAt"] = self.expires_at
        return out


@dataclass(frozen=True, slots=True)
class CategoriesOut:
    """``list_categories``'s answer: listed providers counted per tag."""

    tags: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"tags": dict(sorted(self.tags.items()))}


@dataclass(frozen=True, slots=True)
class PolicyOut:
    """``policy``'s answer: the directory's terms and its hex ed25519
    snapshot key."""

    name: str
    listing_fee_atoms: int
    snapshot_price_atoms: int
    search_price_atoms: int
    test_budget_max_atoms: int
    expiry_days: int
    pub_key: str

    @classmethod
    def from_json(cls, value: Any) -> PolicyOut:
        obj = _object(value, "policy")
        return cls(
            name=_str(obj, "name", "policy"),
            listing_fee_atoms=_int(obj, "listingFeeAtoms", "policy"),
            snapshot_price_atoms=_int(obj, "snapshotPriceAtoms", "policy"),
            search_price_atoms=_int(obj, "searchPriceAtoms", "policy"),
            test_budget_max_atoms=_int(obj, "testBudgetMaxAtoms", "policy"),
            expiry_days=_int(obj, "expiryDays", "policy"),
            pub_key=_str(obj, "pubKey", "policy"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listingFeeAtoms": self.listing_fee_atoms,
            "snapshotPriceAtoms": self.snapshot_price_atoms,
            "searchPriceAtoms": self.search_price_atoms,
            "testBudgetMaxAtoms": self.test_budget_max_atoms,
            "expiryDays": self.expiry_days,
            "pubKey": self.pub_key,
        }
