"""``brmcp-bridge settings set KEY=VALUE...`` (BRIDGE.md §Settings, "Admin
surface"): the pairs parsed into a change of ``mcpclient.json``, and that
change applied to the file itself when the daemon's admin surface cannot
take it: the daemon is not running (the settings apply when it starts), or
the bridge is disabled (the file is edited and the daemon sent SIGHUP).
The file gets the validation the admin surface applies; enabling without a
token mints one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from brmcp.bridge.base import (
    MODE_APPROVAL,
    MODE_AUTOPAY,
    PROG,
    SETTINGS_FILE,
    BridgeError,
    Settings,
    SettingsError,
    broken_file_refusal,
    check_new_token,
    load_settings,
    mint_token,
    save_settings,
    setting_names,
    settings_file_problem,
    settings_from_json,
    unknown_setting_hint,
)

from ._adminclient import CLIError, Daemon, admin

__all__ = ["RELOAD_WAIT", "edit_file", "parse_pairs", "set_offline"]

#: Seconds ``settings set`` waits for a reloaded daemon to open its endpoint.
RELOAD_WAIT = 10.0

_BOOLS = {
    "true": True,
    "false": False,
    "1": True,
    "0": False,
    "yes": True,
    "no": False,
    "on": True,
    "off": False,
}
_INT_SETTINGS = ("per_call_cap_atoms", "per_day_cap_atoms", "approval_timeout_secs", "tip_wait_secs")
_MODES = (MODE_APPROVAL, MODE_AUTOPAY)


def parse_pairs(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a settings change (the JSON the admin surface
    takes): ``enabled`` a boolean (true/false, 1/0, yes/no, on/off), ``mode``
    ``approval`` or ``autopay``, the caps and timeouts integers (atoms,
    seconds), ``allowed_bots``, ``prepay_bots`` and ``directories`` comma-separated uids, a
    ``token`` checked as a new token. Raises :class:`CLIError` for no
    pairs, a malformed pair, an unknown key (naming the closest key, e.g.
    ``did you mean per_call_cap_atoms?``) or a bad value."""
    if not pairs:
        raise CLIError(f"settings set needs KEY=VALUE pairs; keys: {', '.join(setting_names())}")
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise CLIError(f"{pair!r}: expected KEY=VALUE")
        if key not in setting_names():
            raise CLIError(unknown_setting_hint(key))
        if key == "enabled":
            if value.lower() not in _BOOLS:
                raise CLIError(f"enabled={value!r}: use true or false")
            changes[key] = _BOOLS[value.lower()]
        elif key == "mode":
            if value.lower() not in _MODES:
                raise CLIError(f"mode={value!r}: use {MODE_APPROVAL} or {MODE_AUTOPAY}")
            changes[key] = value.lower()
        elif key in _INT_SETTINGS:
            try:
                changes[key] = int(value)
            except ValueError:
                raise CLIError(f"{key}={value!r}: not an integer number of {_unit(key)}") from None
        elif key in ("allowed_bots", "prepay_bots", "directories"):
            changes[key] = [uid.strip() for uid in value.split(",") if uid.strip()]
        elif key == "token":
            try:
                check_new_token(value)
            except SettingsError as exc:
                raise CLIError(str(exc)) from None
            changes[key] = value
        else:
            changes[key] = value
    return changes


def _unit(key: str) -> str:
    return "atoms" if key.endswith("_atoms") else "seconds"


def edit_file(datadir: Path, changes: dict[str, Any]) -> tuple[Path, Settings]:
    """Apply ``changes`` to ``mcpclient.json`` itself, with the validation the
    admin surface applies; enabling without a token mints one. Returns the
    file's path and the settings saved. Raises :class:`CLIError`, also for a
    file that fails to load (it is left as it is: :func:`broken_file_refusal`)."""
    path = datadir / SETTINGS_FILE
    problem = settings_file_problem(path)
    if problem is not None:
        raise CLIError(broken_file_refusal(problem))
    try:
        current = load_settings(path)
        candidate = settings_from_json(json.dumps(changes), base=current).normalized()
        candidate.validate()
    except (SettingsError, BridgeError) as exc:
        raise CLIError(str(exc)) from None
    if candidate.enabled and not candidate.token:
        candidate = candidate.replace(token=mint_token())
    try:
        save_settings(path, candidate)
    except BridgeError as exc:
        raise CLIError(str(exc)) from None
    return path, candidate


def set_offline(daemon: Daemon, changes: dict[str, Any]) -> dict[str, Any]:
    """Apply ``changes`` to mcpclient.json directly (the admin surface is
    off) and have the running daemon reload it (SIGHUP); when the change
    enables the bridge, wait up to :data:`RELOAD_WAIT` s for the daemon's
    answer. Returns the settings in force as JSON. Raises :class:`CLIError`."""
    path, candidate = edit_file(daemon.datadir, changes)
    if not daemon.sighup:
        print(
            f"{PROG}: saved {path}; this daemon does not reload on SIGHUP, restart it to apply",
            file=sys.stderr,
        )
        return candidate.to_dict()
    try:
        os.kill(daemon.pid, signal.SIGHUP)
    except OSError as exc:
        raise CLIError(f"saved {path}, but could not signal the daemon (pid {daemon.pid}): {exc}") from None
    print(
        f"{PROG}: the bridge was disabled: saved {path} and sent SIGHUP to pid {daemon.pid}", file=sys.stderr
    )
    if not candidate.enabled:
        return candidate.to_dict()
    deadline = time.monotonic() + RELOAD_WAIT
    while True:
        try:
            answer = admin(daemon, "GET", "/admin/settings")
        except CLIError:
            if time.monotonic() > deadline:
                raise CLIError(
                    f"saved {path}, but the daemon (pid {daemon.pid}) did not open {daemon.url} "
                    f"within {RELOAD_WAIT:.0f}s; see its log"
                ) from None
            time.sleep(0.1)
            continue
        return dict(answer)
