"""What every room of the bridge stands on: its errors, the settings file
``mcpclient.json`` (BRIDGE.md §Settings), durable file replacement, the
command line that hints print, and small ASGI helpers. Imports no other room."""

from __future__ import annotations

from ._asgi import (
    MAX_ADMIN_BODY_BYTES,
    PathHandler,
    header_values,
    read_body,
    replay_body,
    route_path,
    send_json,
    send_text,
)
from ._command import (
    PROG,
    cli_command,
    default_datadir,
)
from ._errors import (
    BridgeError,
    SettingsError,
    SettingsFileBroken,
)
from ._files import (
    read_text,
    write_atomic,
)
from ._settings import (
    ADMIN_TOKEN_FILE,
    DEFAULT_APPROVAL_TIMEOUT_SECS,
    DEFAULT_LISTEN,
    DEFAULT_TIP_WAIT_SECS,
    MIN_TOKEN_CHARS,
    MODE_APPROVAL,
    MODE_AUTOPAY,
    SETTINGS_FILE,
    Settings,
    broken_file_refusal,
    check_new_token,
    describe_changes,
    is_uid,
    load_settings,
    mint_token,
    save_settings,
    setting_names,
    settings_file_problem,
    settings_file_warnings,
    settings_from_json,
    unknown_setting_hint,
    with_allowed,
)

__all__ = [
    "ADMIN_TOKEN_FILE",
    "DEFAULT_APPROVAL_TIMEOUT_SECS",
    "DEFAULT_LISTEN",
    "DEFAULT_TIP_WAIT_SECS",
    "MAX_ADMIN_BODY_BYTES",
    "MIN_TOKEN_CHARS",
    "MODE_APPROVAL",
    "MODE_AUTOPAY",
    "PROG",
    "SETTINGS_FILE",
    "BridgeError",
    "PathHandler",
    "Settings",
    "SettingsError",
    "SettingsFileBroken",
    "broken_file_refusal",
    "check_new_token",
    "cli_command",
    "default_datadir",
    "describe_changes",
    "header_values",
    "is_uid",
    "load_settings",
    "mint_token",
    "read_body",
    "read_text",
    "replay_body",
    "route_path",
    "save_settings",
    "send_json",
    "send_text",
    "setting_names",
    "settings_file_problem",
    "settings_file_warnings",
    "settings_from_json",
    "unknown_setting_hint",
    "with_allowed",
    "write_atomic",
]
