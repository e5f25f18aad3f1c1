"""The provider's directory settings: :class:`RegistrantConfig` (what it
registers and where) and :class:`AutoFund` (when it pays for a listing
unattended), with their JSON forms in ``brmcp.json``'s ``directory`` block
(docs/directory.md, "The provider side"; karamble/brmcp,
``directory/registrant.go``). Amounts are atoms (int)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..model import (
    MAX_DESCRIPTION_LEN,
    MAX_TAG_LEN,
    MAX_TAGS,
    RegisterIn,
    StatusOut,
    TestSpec,
    validate_register,
)

__all__ = ["AutoFund", "RegistrantConfig", "RegistrantError", "RegistrationError"]

log = logging.getLogger("brmcp.directory.provider._registrant")

_UID = re.compile(r"[0-9a-f]{64}")
_INT64_MAX = (1 << 63) - 1


class RegistrantError(ValueError):
    """An invalid :class:`RegistrantConfig` or :class:`AutoFund`, or an
    unreadable fund history; the one-line message names the key or file."""


class RegistrationError(Exception):
    """A registration that did not complete; ``status`` is the directory's
    last answer (None when there was none)."""

    def __init__(self, message: str, status: StatusOut | None = None) -> None:
        super().__init__(message)
        self.status = status


def _uid(value: Any, where: str) -> str:
    if not isinstance(value, str) or _UID.fullmatch(value.lower()) is None:
        raise RegistrantError(f"{where}: {_shown(value)} is not a Bison Relay uid (64 hex characters)")
    return value.lower()


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def lookup_field(obj: Mapping[str, Any], key: str) -> Any:
    """Go's key matching: the exact key, else the first case-insensitive one."""
    if key in obj:
        return obj[key]
    folded = key.casefold()
    for name, item in obj.items():
        if name.casefold() == folded:
            return item
    return None


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RegistrantError(f"{where}: {_shown(value)} is not allowed: use a JSON object")
    return value


def _count(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = lookup_field(obj, key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT64_MAX:
        raise RegistrantError(
            f"{where}.{key}: {_shown(value)} is not allowed: use a whole number of atoms >= 0"
        )
    return value


def _uids(obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = lookup_field(obj, key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RegistrantError(f'{where}.{key}: {_shown(value)} is not allowed: use ["<64-hex uid>", ...]')
    return tuple(dict.fromkeys(_uid(item, f"{where}.{key}[{i}]") for i, item in enumerate(value)))


@dataclass(frozen=True, slots=True)
class AutoFund:
    """When listing costs are paid without the operator (JSON keys
    ``enabled``, ``max_atoms_per_request``, ``max_atoms_per_month``,
    ``allowed_directory_uids``; karamble/brmcp, ``directory/registrant.go``).

    Disabled by default: invoices and invites then only reach the operator's
    notify callback. ``max_atoms_per_request`` caps one registration (the
    listing fee plus the test budget), ``max_atoms_per_month`` the rolling
    30-day total over every directory; a cap of 0 pays nothing (the Go
    reference reads 0 as no cap: this one never pays without a bound).
    ``allowed_directory_uids``, when not empty, are the only directories
    funded or whose invites are accepted (lowercase 64-hex uids).
    """

    enabled: bool = False
    max_atoms_per_request: int = 0
    max_atoms_per_month: int = 0
    allowed_directory_uids: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, value: Any, *, where: str = "auto_fund") -> AutoFund:
        """Decode the JSON object (keys matched case-insensitively, null is
        the default). Raises :class:`RegistrantError` naming ``where`` and
        the key for a value of the wrong kind, a negative cap, a uid that is
        not 64 hex, or ``enabled`` true with a cap of 0 (it would pay
        nothing)."""
        obj = _object(value, where)
        enabled = lookup_field(obj, "enabled")
        if enabled is None:
            enabled = False
        if not isinstance(enabled, bool):
            raise RegistrantError(f"{where}.enabled: {_shown(enabled)} is not allowed: use true or false")
        fund = cls(
            enabled=enabled,
            max_atoms_per_request=_count(obj, "max_atoms_per_request", where),
            max_atoms_per_month=_count(obj, "max_atoms_per_month", where),
            allowed_directory_uids=_uids(obj, "allowed_directory_uids", where),
        )
        if enabled:
            for key, cap in (
                ("max_atoms_per_request", fund.max_atoms_per_request),
                ("max_atoms_per_month", fund.max_atoms_per_month),
            ):
                if cap <= 0:
                    raise RegistrantError(
                        f"{where}.{key}: 0 is not allowed while enabled is true (it would pay nothing): "
                        "use the most atoms to spend (> 0), or set enabled to false"
                    )
        return fund

    def to_json(self) -> dict[str, Any]:
        """The Go struct's JSON (keys in its order)."""
        return {
            "enabled": self.enabled,
            "max_atoms_per_request": self.max_atoms_per_request,
            "max_atoms_per_month": self.max_atoms_per_month,
            "allowed_directory_uids": list(self.allowed_directory_uids),
        }


_CONFIG_KEYS = ("description", "tags", "test", "auto_fund", "register_at_uids")


@dataclass(frozen=True, slots=True)
class RegistrantConfig:
    """What a provider registers as and where (the ``directory`` block of
    brmcp-serve's ``brmcp.json``, the Go reference's keys: ``description``,
    ``tags``, ``test`` ``{tool, args, maxAtoms}``, ``auto_fund``
    (:class:`AutoFund`), ``register_at_uids``; karamble/brmcp,
    ``cmd/brmcp-serve/main.go``).

    ``test`` is the paid call a directory makes to verify the provider, at
    most ``test.max_atoms`` atoms; ``register_at_uids`` are the directories
    registered with at every start (lowercase 64-hex uids).
    """

    description: str
    test: TestSpec
    tags: tuple[str, ...] = ()
    auto_fund: AutoFund = field(default_factory=AutoFund)
    register_at_uids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            validate_register(self.registration(), self.test.max_atoms)
        except ValueError as exc:
            raise RegistrantError(str(exc)) from None

    def registration(self) -> RegisterIn:
        """The ``register`` input sent to every directory."""
        return RegisterIn(description=self.description, tags=self.tags, test=self.test)

    def to_json(self) -> dict[str, Any]:
        """The block as JSON, in the Go struct's key order."""
        return {
            "description": self.description,
            "tags": list(self.tags),
            "test": self.test.to_json(),
            "auto_fund": self.auto_fund.to_json(),
            "register_at_uids": list(self.register_at_uids),
        }

    @property
    def directory_uids(self) -> tuple[str, ...]:
        """Every directory this configuration names (``register_at_uids``,
        then ``auto_fund.allowed_directory_uids``), without duplicates: the
        callers a provider must admit for those directories to crawl and
        test-call it."""
        return tuple(dict.fromkeys((*self.register_at_uids, *self.auto_fund.allowed_directory_uids)))

    @classmethod
    def from_json(cls, value: Any, *, where: str = "directory") -> RegistrantConfig:
        """Decode and validate the block (keys matched case-insensitively,
        as Go's decoder does; unknown keys are logged at WARNING and
        ignored). Raises :class:`RegistrantError` with one line naming
        ``where``, the key, the value and what is allowed: ``description``
        1..1024 bytes, at most 16 ``tags`` of 1..32 bytes, ``test.tool``
        required, ``test.args`` an object, ``test.maxAtoms`` > 0, uids of
        64 hex (:meth:`AutoFund.from_json` for ``auto_fund``)."""
        if not isinstance(value, Mapping):
            raise RegistrantError(f"{where}: {_shown(value)} is not allowed: use a JSON object")
        folded = {k.casefold() for k in _CONFIG_KEYS}
        for key in value:
            if key.casefold() not in folded:
                log.warning(
                    "%s: unknown key %s ignored (the keys are %s)",
                    where,
                    json.dumps(key),
                    ", ".join(_CONFIG_KEYS),
                )
        description = lookup_field(value, "description")
        if not isinstance(description, str) or not description.strip():
            raise RegistrantError(
                f"{where}.description: {_shown(description)} is not allowed: use a non-empty string "
                "saying what the bot offers"
            )
        if len(description.encode()) > MAX_DESCRIPTION_LEN:
            raise RegistrantError(
                f"{where}.description: {len(description.encode())} bytes is too long: use at most "
                f"{MAX_DESCRIPTION_LEN}"
            )
        tags_value = lookup_field(value, "tags")
        if tags_value is None:
            tags_value = []
        if not isinstance(tags_value, list) or len(tags_value) > MAX_TAGS:
            raise RegistrantError(
                f"{where}.tags: {_shown(tags_value)} is not allowed: use a list of at most {MAX_TAGS} strings"
            )
        for index, tag in enumerate(tags_value):
            if not isinstance(tag, str) or not 1 <= len(tag.encode()) <= MAX_TAG_LEN:
                raise RegistrantError(
                    f"{where}.tags[{index}]: {_shown(tag)} is not allowed: "
                    f"use a string of 1-{MAX_TAG_LEN} bytes"
                )
        test_obj = _object(lookup_field(value, "test"), f"{where}.test")
        tool = lookup_field(test_obj, "tool")
        if not isinstance(tool, str) or not tool.strip():
            raise RegistrantError(
                f"{where}.test.tool: {_shown(tool)} is not allowed: name the paid tool the directory "
                "calls to verify the bot"
            )
        args = lookup_field(test_obj, "args")
        if args is not None and not isinstance(args, Mapping):
            raise RegistrantError(f"{where}.test.args: {_shown(args)} is not allowed: use a JSON object")
        max_atoms = lookup_field(test_obj, "maxAtoms")
        if isinstance(max_atoms, bool) or not isinstance(max_atoms, int) or not 0 < max_atoms <= _INT64_MAX:
            raise RegistrantError(
                f"{where}.test.maxAtoms: {_shown(max_atoms)} is not allowed: use the most atoms the test "
                "call may cost (> 0)"
            )
        return cls(
            description=description,
            tags=tuple(tags_value),
            test=TestSpec(tool=tool, args=dict(args) if args else None, max_atoms=max_atoms),
            auto_fund=AutoFund.from_json(lookup_field(value, "auto_fund"), where=f"{where}.auto_fund"),
            register_at_uids=_uids(value, "register_at_uids", where),
        )
