"""Errors raised by the bridge."""

from __future__ import annotations

__all__ = ["BridgeError", "SettingsError"]


class BridgeError(Exception):
    """The bridge cannot do what was asked: an unreadable or malformed state
    file (the message names the path), a failed write, or a listener that
    could not bind. State is never changed when this is raised, except where
    a method documents otherwise."""


class SettingsError(BridgeError, ValueError):
    """Settings that fail validation, e.g. ``allowed bot "<x>" is not a
    64-hex uid`` (BRIDGE.md §Settings); the prior settings stay in force."""
