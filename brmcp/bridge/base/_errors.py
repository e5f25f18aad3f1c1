"""Errors raised by the bridge."""

from __future__ import annotations

__all__ = ["BridgeError", "SettingsError", "SettingsFileBroken"]


class BridgeError(Exception):
    """The bridge cannot do what was asked: an unreadable or malformed state
    file (the message names the path), a failed write, or a listener that
    could not bind. State is never changed when this is raised, except where
    a method documents otherwise."""


class SettingsError(BridgeError, ValueError):
    """Settings that fail validation, e.g. ``allowed bot "<x>" is not a
    64-hex uid`` (BRIDGE.md §Settings); the prior settings stay in force."""


class SettingsFileBroken(BridgeError):
    """``mcpclient.json`` exists but fails to load (a hand edit with a JSON
    error, a wrongly typed value), so a change of the settings is refused
    rather than overwriting it: the message names the file and the parse
    error and says to fix or remove it. The settings in force stay."""
