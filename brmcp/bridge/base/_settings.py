"""The user's bridge policy, stored as ``mcpclient.json`` (BRIDGE.md §Settings).

The file has exactly the Go reference's keys, order and layout, so either
implementation reads what the other wrote::

    {
      "enabled": false,
      "token": "",
      "mode": "approval",
      "per_call_cap_atoms": 0,
      "per_day_cap_atoms": 0,
      "allowed_bots": null,
      "approval_timeout_secs": 120,
      "tip_wait_secs": 180
    }

Loading follows Go's rules (keys case-insensitive, unknown keys ignored), so
a file either implementation wrote keeps loading; :func:`load_settings` logs
a WARNING (logger ``brmcp.bridge``) for each unknown key, naming the file,
the key and the closest known key ("did you mean"), and for a ``mode`` that
is neither ``approval`` nor ``autopay`` (it loads as approval, as in Go:
BRIDGE.md §Settings), naming the allowed values (:func:`settings_file_warnings`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brmcp._ops import gojson as _gojson

from ._errors import BridgeError, SettingsError
from ._files import read_text, write_atomic

__all__ = [
    "ADMIN_TOKEN_FILE",
    "DEFAULT_APPROVAL_TIMEOUT_SECS",
    "DEFAULT_LISTEN",
    "DEFAULT_TIP_WAIT_SECS",
    "MAX_DIRECTORIES",
    "MIN_TOKEN_CHARS",
    "MODE_APPROVAL",
    "MODE_AUTOPAY",
    "SETTINGS_FILE",
    "Settings",
    "broken_file_refusal",
    "check_new_token",
    "closest_setting",
    "is_uid",
    "load_settings",
    "mint_token",
    "save_settings",
    "setting_names",
    "settings_file_problem",
    "settings_file_warnings",
    "settings_from_json",
    "unknown_setting_hint",
    "with_allowed",
]

log = logging.getLogger("brmcp.bridge")

#: File name inside the bridge's data directory.
SETTINGS_FILE = "mcpclient.json"
#: File (in the data directory) holding the admin surface's bearer token.
ADMIN_TOKEN_FILE = "mcpadmin.token"
#: The daemon's default endpoint address.
DEFAULT_LISTEN = "127.0.0.1:8891"
#: Every payment waits for the user's decision.
MODE_APPROVAL = "approval"
#: Payments within the caps are made without asking.
MODE_AUTOPAY = "autopay"
#: Seconds a parked payment waits for a decision (used when the field is ≤ 0).
DEFAULT_APPROVAL_TIMEOUT_SECS = 120
#: Seconds a payment may take to be confirmed (used when the field is ≤ 0).
DEFAULT_TIP_WAIT_SECS = 180

#: Shortest agent token a user may set (a minted one has 32); the admin
#: token file has the same floor.
MIN_TOKEN_CHARS = 16

_UID_RE = re.compile(r"[0-9a-f]{64}")

_FIELDS: dict[str, _gojson.Kind] = {
    "enabled": "bool",
    "token": "string",
    "mode": "string",
    "per_call_cap_atoms": "int64",
    "per_day_cap_atoms": "int64",
    "allowed_bots": "strings",
    "approval_timeout_secs": "int64",
    "tip_wait_secs": "int64",
    "prepay_bots": "strings",
    "directories": "strings",
}

#: Most directories ``directories`` may name (each is asked on every ``find``).
MAX_DIRECTORIES = 32


def is_uid(value: str) -> bool:
    """True when ``value`` lowercased is a 64-hex Bison Relay uid."""
    return _UID_RE.fullmatch(value.lower()) is not None


@dataclass(frozen=True, slots=True)
class Settings:
    """The bridge policy (BRIDGE.md §Settings). Immutable; derive changed
    copies with :meth:`replace`.

    * ``enabled``: serve the local endpoint at all.
    * ``token``: the bearer token agents present; empty never authorizes.
    * ``mode``: ``"approval"`` or ``"autopay"`` (anything else means approval).
    * ``per_call_cap_atoms`` / ``per_day_cap_atoms``: atoms; ≤ 0 means never
      pay. The day is a rolling 24 hours. Caps bind in both modes.
    * ``allowed_bots``: bot uids (64 hex, matched case-insensitively, stored
      as given); None is written as ``null``. Empty denies every bot.
    * ``approval_timeout_secs``: how long a parked payment waits (≤ 0: 120).
    * ``tip_wait_secs``: how long a payment may take (≤ 0: 180).
    * ``prepay_bots``: bot uids whose balance the bridge keeps topped up
      ahead of need (BRIDGE.md §Pay alongside and prepay); None or empty: prepay is off.
      Written only when set (the Go reference has no such key and ignores it).
    * ``directories``: uids of the brmcp directories ``brmcp-bridge find``
      asks (docs/directory.md), at most :data:`MAX_DIRECTORIES`; a directory is
      a bot like any other, reachable as if it were on ``allowed_bots``
      (:meth:`allows`), under the same caps. Written only when set; the Go
      reference ignores the key (its ``json.Unmarshal`` drops unknown keys),
      so a Go bridge on the same file does not reach a directory that is
      not also on ``allowed_bots``.
    """

    enabled: bool = False
    token: str = ""
    mode: str = MODE_APPROVAL
    per_call_cap_atoms: int = 0
    per_day_cap_atoms: int = 0
    allowed_bots: tuple[str, ...] | None = None
    approval_timeout_secs: int = DEFAULT_APPROVAL_TIMEOUT_SECS
    tip_wait_secs: int = DEFAULT_TIP_WAIT_SECS
    prepay_bots: tuple[str, ...] | None = None
    directories: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("allowed_bots", "prepay_bots", "directories"):
            bots: Any = getattr(self, name)
            if bots is not None and not isinstance(bots, tuple):
                if isinstance(bots, str) or not isinstance(bots, Iterable):
                    raise SettingsError(f"{name} must be a list of uids")
                object.__setattr__(self, name, tuple(bots))

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (field names as keyword arguments)."""
        return dataclasses.replace(self, **changes)

    def normalized(self) -> Settings:
        """Defaults applied: the mode is ``"autopay"`` only when exactly that,
        otherwise ``"approval"``; timeouts ≤ 0 become 120 and 180 seconds."""
        return self.replace(
            mode=MODE_AUTOPAY if self.mode == MODE_AUTOPAY else MODE_APPROVAL,
            approval_timeout_secs=(
                self.approval_timeout_secs
                if self.approval_timeout_secs > 0
                else DEFAULT_APPROVAL_TIMEOUT_SECS
            ),
            tip_wait_secs=self.tip_wait_secs if self.tip_wait_secs > 0 else DEFAULT_TIP_WAIT_SECS,
        )

    def validate(self) -> None:
        """Raise :class:`SettingsError` for a wrongly typed field or an
        allowed bot that is not a 64-hex uid (the Go message:
        ``allowed bot "<x>" is not a 64-hex uid``)."""
        for name in ("enabled",):
            if not isinstance(getattr(self, name), bool):
                raise SettingsError(f"{name} must be true or false")
        for name in ("token", "mode"):
            if not isinstance(getattr(self, name), str):
                raise SettingsError(f"{name} must be a string")
        for name in ("per_call_cap_atoms", "per_day_cap_atoms", "approval_timeout_secs", "tip_wait_secs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not -(1 << 63) <= value < (1 << 63):
                raise SettingsError(f"{name} must be a 64-bit integer")
        for bot in self.allowed_bots or ():
            if not isinstance(bot, str) or not is_uid(bot):
                raise SettingsError(f"allowed bot {_go_quote(bot)} is not a 64-hex uid")
        for bot in self.prepay_bots or ():
            if not isinstance(bot, str) or not is_uid(bot):
                raise SettingsError(f"prepay bot {_go_quote(bot)} is not a 64-hex uid")
        for bot in self.directories or ():
            if not isinstance(bot, str) or not is_uid(bot):
                raise SettingsError(
                    f"directories: {_go_quote(bot)} is not a 64-hex uid (a directory is named by its "
                    "Bison Relay uid, 64 hex characters)"
                )
        if len(self.directories or ()) > MAX_DIRECTORIES:
            raise SettingsError(
                f"directories: {len(self.directories or ())} uids given; at most {MAX_DIRECTORIES} allowed"
            )

    def allows(self, uid: str) -> bool:
        """True when ``uid`` is on ``allowed_bots`` or ``directories``
        (case-insensitive): a directory the user configured is reached as a
        bot (BRIDGE.md §Finding bots through directories)."""
        wanted = uid.lower()
        return any(bot.lower() == wanted for bot in (self.allowed_bots or ()) + (self.directories or ()))

    def is_directory(self, uid: str) -> bool:
        """True when ``uid`` is on ``directories`` (case-insensitive)."""
        wanted = uid.lower()
        return any(bot.lower() == wanted for bot in self.directories or ())

    def prepays(self, uid: str) -> bool:
        """True when prepay is on for ``uid`` (on ``prepay_bots``, case-insensitive)."""
        wanted = uid.lower()
        return any(bot.lower() == wanted for bot in self.prepay_bots or ())

    @property
    def autopay(self) -> bool:
        return self.mode == MODE_AUTOPAY

    def to_dict(self) -> dict[str, Any]:
        """The JSON object in the Go key order."""
        return (
            {
                "enabled": self.enabled,
                "token": self.token,
                "mode": self.mode,
                "per_call_cap_atoms": self.per_call_cap_atoms,
                "per_day_cap_atoms": self.per_day_cap_atoms,
                "allowed_bots": list(self.allowed_bots) if self.allowed_bots is not None else None,
                "approval_timeout_secs": self.approval_timeout_secs,
                "tip_wait_secs": self.tip_wait_secs,
            }
            | ({"prepay_bots": list(self.prepay_bots)} if self.prepay_bots else {})
            | ({"directories": list(self.directories)} if self.directories else {})
        )

    def to_json(self) -> str:
        """The file content: Go's ``MarshalIndent`` with two spaces."""
        return _gojson.dumps(self.to_dict(), indent=True)


def _go_quote(value: Any) -> str:
    """Go's ``%q`` for the common cases (printable text in double quotes)."""
    if not isinstance(value, str):
        value = str(value)
    return _gojson.dumps(value).replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&")


def describe_changes(before: Settings, after: Settings) -> str:
    """The differences between two settings as ``key old→new`` items joined
    by ``, `` (empty when equal). The token is never shown: a change reads
    ``token changed`` (or ``token minted``/``token cleared``)."""
    items: list[str] = []
    old, new = before.to_dict(), after.to_dict()
    for key in setting_names():
        if old.get(key) == new.get(key):
            continue
        if key == "token":
            verb = "minted" if not old[key] else "cleared" if not new[key] else "changed"
            items.append(f"token {verb}")
        elif key in ("allowed_bots", "prepay_bots", "directories"):
            was = {b.lower() for b in old.get(key) or ()}
            now = {b.lower() for b in new.get(key) or ()}
            added, removed = sorted(now - was), sorted(was - now)
            parts = [f"+{b}" for b in added] + [f"-{b}" for b in removed]
            items.append(f"{key} {' '.join(parts) if parts else 'reordered'}")
        else:
            items.append(f"{key} {json.dumps(old.get(key))}→{json.dumps(new.get(key))}")
    return ", ".join(items)


def with_allowed(settings: Settings, uids: Sequence[str]) -> Settings:
    """``settings`` with each of ``uids`` (64 hex, lowercased) appended to
    ``allowed_bots`` unless it is there already (case-insensitive), nothing
    else changed; ``settings`` itself when nothing is added (a commit then
    writes nothing). A change to apply against the settings in force
    (:meth:`~brmcp.bridge.Bridge.update_settings`), so that adding a bot
    composes with other changes made at the same moment."""
    allowed = settings.allowed_bots or ()
    have = {bot.lower() for bot in allowed}
    added: list[str] = []
    for uid in uids:
        uid = uid.lower()
        if uid not in have:
            have.add(uid)
            added.append(uid)
    if not added:
        return settings
    return settings.replace(allowed_bots=(*allowed, *added))


def setting_names() -> tuple[str, ...]:
    """The JSON keys of the settings file, in file order."""
    return tuple(_FIELDS)


def mint_token() -> str:
    """A fresh bearer token: 16 random bytes as 32 lowercase hex."""
    return secrets.token_hex(16)


def check_new_token(token: object) -> None:
    """Refuse a bearer token a user sets (``settings set token=…``, the admin
    API) that is too short to be a secret: non-empty, at least
    :data:`MIN_TOKEN_CHARS` characters, no whitespace (it goes in an
    ``Authorization: Bearer`` header). Empty is allowed: enabling mints one.
    Files are not checked on load, so a Go bridge's file still loads.
    Raises :class:`SettingsError` with one line."""
    if not isinstance(token, str) or not token:
        return
    if any(ch.isspace() for ch in token):
        raise SettingsError("token must not contain spaces")
    if len(token) < MIN_TOKEN_CHARS:
        raise SettingsError(
            f"token is {len(token)} character(s): use at least {MIN_TOKEN_CHARS} "
            f"(or token= and enabled=true to have a random one minted)"
        )


def settings_from_json(text: str | bytes, *, base: Settings | None = None) -> Settings:
    """Decode a settings object with Go's rules (keys case-insensitive,
    unknown keys ignored, ``null`` keeps the base value, wrong types are
    errors) on top of ``base`` (default: :class:`Settings` defaults).
    ``allowed_bots: null`` resets the list to None. Raises
    :class:`SettingsError` with the decoder's reason; the result is not yet
    normalized or validated."""
    try:
        parsed = _gojson.loads(text)
        fields = _gojson.decode_struct(parsed, _FIELDS, struct="bridge settings")
    except _gojson.GoJSONError as exc:
        raise SettingsError(str(exc)) from None
    result = base or Settings()
    # Go: explicit null for a slice sets it to nil.
    if isinstance(parsed, list):
        for key, value in parsed:
            if value is None and key.lower() in ("allowed_bots", "prepay_bots", "directories"):
                result = result.replace(**{key.lower(): None})
    for name in ("allowed_bots", "prepay_bots", "directories"):
        if name in fields:
            fields[name] = tuple(fields[name])
    return result.replace(**fields)


def closest_setting(key: str) -> str | None:
    """The settings key most like ``key`` (case and a typo or a missing
    ``_atoms`` forgiven: ``per_call_cap`` → ``per_call_cap_atoms``), or
    None when none is close. What the file loader's warnings, ``settings
    set`` and the admin API suggest ("did you mean")."""
    names = list(_FIELDS)
    folded = key.casefold()
    close = difflib.get_close_matches(folded, names, n=1)
    if close:
        return close[0]
    # A prefix of a key (the unit left out) is as good a guess.
    starts = [name for name in names if len(folded) >= 4 and name.startswith(folded)]
    return starts[0] if len(starts) == 1 else None


def unknown_setting_hint(key: str) -> str:
    """The refusal of an unknown key in a change of the settings (``settings
    set``, the admin API): ``unknown setting 'per_call_cap' (did you mean
    per_call_cap_atoms?); keys: enabled, token, …``."""
    close = closest_setting(key)
    hint = f" (did you mean {close}?)" if close is not None else ""
    return f"unknown setting {key!r}{hint}; keys: {', '.join(_FIELDS)}"


def settings_file_warnings(text: str | bytes, source: str) -> list[str]:
    """One line per surprise in a settings file that still loads: an
    unknown key (``<source>: unknown key "per_call_cap" ignored (did you
    mean "per_call_cap_atoms"?)``; Go ignores it too) and a ``mode`` other
    than ``approval``/``autopay`` (it loads as approval). Empty for text
    that is not a JSON object (the loader reports that as an error)."""
    try:
        parsed = _gojson.loads(text)
    except _gojson.GoJSONError:
        return []
    if not isinstance(parsed, list):
        return []
    names = list(_FIELDS)
    folded = {name.casefold(): name for name in names}
    out: list[str] = []
    mode: Any = None
    for key, value in parsed:
        name = key if key in _FIELDS else folded.get(key.casefold())
        if name is None:
            guess = closest_setting(key)
            hint = f'did you mean "{guess}"?' if guess else f"the keys are {', '.join(names)}"
            out.append(f"{source}: unknown key {_go_quote(key)} ignored ({hint})")
        elif name == "mode" and value is not None:
            mode = value
    if isinstance(mode, str) and mode not in (MODE_APPROVAL, MODE_AUTOPAY):
        close = difflib.get_close_matches(mode.casefold(), [MODE_APPROVAL, MODE_AUTOPAY], n=1)
        hint = f'; did you mean "{close[0]}"?' if close else ""
        out.append(
            f'{source}: "mode": {_go_quote(mode)} is not allowed (use "{MODE_APPROVAL}" or '
            f'"{MODE_AUTOPAY}", in lower case{hint}): it loads as {MODE_APPROVAL}, so every payment '
            "waits for your approval"
        )
    return out


def settings_file_problem(path: Path) -> str | None:
    """Why ``path`` (``mcpclient.json``) fails to load, as
    :func:`load_settings` would raise it (``parse <path>: …``, ``read
    <path>: …``), or None when it loads or does not exist. Logs nothing
    (a file that loads with warnings is no problem here)."""
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        return f"read {path}: {exc}"
    if text is None:
        return None
    try:
        settings_from_json(text).normalized().validate()
    except SettingsError as exc:
        return f"parse {path}: {exc}{_held_value(text, str(exc))}"
    return None


def broken_file_refusal(problem: str) -> str:
    """The refusal of a change that would overwrite a settings file that
    fails to load (``problem``: :func:`settings_file_problem`)."""
    return (
        f"{problem}; nothing was changed: a settings file that fails to load is not overwritten (its "
        "other edits would be lost); fix it or remove it, then change the settings again"
    )


def load_settings(path: Path) -> Settings:
    """Read ``mcpclient.json``: a missing file gives the defaults; the result
    is normalized and validated. No token is minted on load. Logs each line
    of :func:`settings_file_warnings` at WARNING. Raises :class:`BridgeError`
    naming ``path`` (``parse <path>: …``) for unreadable or malformed
    content; a value of the wrong kind is named with what the file holds."""
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise BridgeError(f"read {path}: {exc}") from None
    if text is None:
        return Settings()
    try:
        settings = settings_from_json(text).normalized()
        settings.validate()
    except SettingsError as exc:
        raise BridgeError(f"parse {path}: {exc}{_held_value(text, str(exc))}") from None
    for warning in settings_file_warnings(text, str(path)):
        log.warning("%s", warning)
    return settings


def _held_value(text: str, message: str) -> str:
    """`` (the file has <value>)`` for a message about one key's value."""
    match = re.match(r'"(\w+)" must be', message)
    if match is None:
        return ""
    try:
        parsed = _gojson.loads(text)
    except _gojson.GoJSONError:
        return ""
    found: Any = None
    for key, value in parsed if isinstance(parsed, list) else ():
        if key.casefold() == match.group(1).casefold():
            found = value
    if found is None:
        return ""
    shown = json.dumps(found)
    return f" (the file has {shown if len(shown) <= 80 else shown[:77] + '...'})"


def save_settings(path: Path, settings: Settings) -> None:
    """Write ``settings`` to ``path`` atomically with mode 0600. Raises
    :class:`BridgeError` naming the path."""
    try:
        write_atomic(path, settings.to_json())
    except OSError as exc:
        raise BridgeError(f"write {path}: {exc}") from None
