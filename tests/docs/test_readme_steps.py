"""README's steps are complete for a new user: every tool a command needs is
either installed by the project or README says how to get it, and a listing's
path ends at "listed", not at the state where it waits for someone."""

from __future__ import annotations

import re

from tests.kit.paths import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")

#: Commands README's examples run that the project's install does not provide,
#: with the words README must use to say how to get each.
EXTERNAL = {"uvx": "pip install uv", "npx": "Node.js"}


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _commands() -> set[str]:
    found: set[str] = set()
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            found.update(word for word in re.findall(r"[\w-]+", line) if word in EXTERNAL)
    return found


def test_every_external_command_in_an_example_says_where_it_comes_from() -> None:
    missing = [
        f"{cmd}: README never says {EXTERNAL[cmd]!r}"
        for cmd in sorted(_commands())
        if EXTERNAL[cmd] not in README
    ]
    assert not missing, missing


def test_listing_a_bot_says_how_a_pending_review_gets_approved() -> None:
    section = _section("List your bot")
    assert "pending_review" in section
    assert "--tool-name approve" in section, "README must show the call that approves a registration"
    assert "admin_uids" in section
