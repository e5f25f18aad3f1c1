"""Go's flag syntax on an argparse command line: Go's ``flag`` package reads
long options with one dash (``-datadir DIR``, ``-datadir=DIR``), and users
of the Go reference (karamble/brmcp) type them so. :func:`go_style` spells
the ones a command accepts with two dashes before argparse sees them, and
refuses another long option given with one dash with a line naming its
two-dash form (argparse would read ``-log-level`` as ``-l og-level`` or
call it an invalid choice).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Collection, Sequence

__all__ = ["GoFlagError", "go_style", "long_options"]

_SINGLE_DASH_LONG = re.compile(r"-([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(=.*)?", re.DOTALL)


class GoFlagError(ValueError):
    """A long option given with one dash that the command does not take in
    Go's syntax; the message is one line naming its two-dash form."""


def long_options(parser: argparse.ArgumentParser) -> set[str]:
    """The long option names (without the dashes) of ``parser`` and of every
    subcommand parser under it: ``{"datadir", "json", "show-token", …}``."""
    names: set[str] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        names.update(opt[2:] for opt in current._option_string_actions if opt.startswith("--"))
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    return names


def go_style(
    argv: Sequence[str],
    accepted: Collection[str],
    known: Collection[str] = (),
    *,
    rest_after: Collection[str] = ("--",),
) -> list[str]:
    """``argv`` with each ``-name`` or ``-name=value`` whose ``name`` is in
    ``accepted`` spelt ``--name`` / ``--name=value``; every other token is
    left as it is. Tokens after one of ``rest_after`` (``--``, or an option
    whose value is the rest of the line, such as ``brmcp-serve --upstream``)
    are not looked at. Raises :class:`GoFlagError` for ``-name`` (or
    ``-name=…``) whose ``name`` is in ``known`` but not in ``accepted``.
    Single-letter options (``-h``) are never touched."""
    out: list[str] = []
    rest = False
    for token in argv:
        if rest:
            out.append(token)
            continue
        if token in rest_after:
            rest = True
            out.append(token)
            continue
        match = _SINGLE_DASH_LONG.fullmatch(token)
        if match is not None and len(match.group(1)) > 1:
            name = match.group(1)
            if name in accepted:
                out.append("-" + token)
                continue
            if name in known:
                raise GoFlagError(f"{token.split('=', 1)[0]}: long options take two dashes here: --{name}")
        out.append(token)
    return out
