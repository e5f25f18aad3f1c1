"""WIRE.md stays true: its worked examples behave as stated, and every
``WIRE.md §Section`` that code cites exists as a heading."""

from __future__ import annotations

import re

import pytest

from brmcp import wire
from brmcp.protocol import payment
from tests.kit.paths import REPO

ROOT = REPO
WIRE_MD = (ROOT / "WIRE.md").read_text(encoding="utf-8")
HEADINGS = set(re.findall(r"^## (.+)$", WIRE_MD, flags=re.MULTILINE))


def _section(name: str) -> str:
    start = WIRE_MD.index(f"\n## {name}\n")
    end = WIRE_MD.find("\n## ", start + 1)
    return WIRE_MD[start : end if end >= 0 else None]


def _cited_sections() -> set[str]:
    cited = set()
    for path in (ROOT / "brmcp").rglob("*.py"):
        for match in re.finditer(r"WIRE\.md (§[^,;)\n]+(?:, §[^,;)\n]+)*)", path.read_text(encoding="utf-8")):
            for ref in match.group(1).split(", "):
                # "§Parsing rule 7" and "§Reassembly lists the order" cite their section.
                name = ref.lstrip("§").split(" rule")[0]
                cited.add(
                    next((h for h in sorted(HEADINGS, key=len, reverse=True) if name.startswith(h)), name)
                )
    return cited


def test_required_sections_exist() -> None:
    required = {
        "Grammar",
        "Parsing",
        "Chunking",
        "Identifiers",
        "Deadlines",
        "Reassembly",
        "Reassembly bounds",
        "Errors",
        "Sessions",
        "Identity",
        "Payments",
        "callKey",
    }
    assert required <= HEADINGS


def test_sections_cited_by_code_exist() -> None:
    cited = _cited_sections()
    assert cited, "expected code to cite WIRE.md sections"
    assert cited <= HEADINGS, f"cited but missing: {sorted(cited - HEADINGS)}"


def test_parsing_rules_are_numbered_one_to_seven() -> None:
    rules = re.findall(r"^\*\*Rule (\d) ", _section("Parsing"), flags=re.MULTILINE)
    assert rules == [str(n) for n in range(1, 8)]


def _example_lines() -> list[str]:
    """Indented lines of the worked examples, up to the list of rejections."""
    section = _section("Worked examples")
    section = section[: section.index("**Rejections**")]
    return [line[4:] for line in section.splitlines() if line.startswith("    ")]


@pytest.mark.parametrize("line", [line for line in _example_lines() if line.startswith("--mcp[")])
def test_worked_example_envelopes_parse_and_re_encode(line: str) -> None:
    part = wire.parse(line)
    assert part is not None
    if part.total == 1:
        assert wire.encode(part.chunk, sid=part.sid, mid=part.mid, exp=part.exp) == [line]


def test_worked_example_rejections_are_not_parts() -> None:
    section = _section("Worked examples")
    block = section[section.index("**Rejections**") :]
    lines = [line[4:] for line in block.splitlines() if line.startswith("    ")]
    assert len(lines) == 10
    for line in lines:
        text = re.sub(r"\s+\([^)]*\)$", "", line)
        assert wire.parse(text) is None, text


def test_worked_example_payloads_match() -> None:
    section = _section("Worked examples")
    payloads = re.findall(r"Payload:\s*`([^`]+)`", section)
    envelopes = [line for line in _example_lines() if line.startswith("--mcp[") and "seq=1/1" in line]
    decoded = {wire.parse(e).chunk.decode() for e in envelopes}  # type: ignore[union-attr]
    assert payloads
    for text in payloads:
        assert text in decoded


def test_payment_required_json_in_doc_is_what_bots_send() -> None:
    shown = re.findall(r'^    (\{"error":"payment_required".*\})$', _section("Payments"), flags=re.MULTILINE)
    assert shown == [payment.payment_required_text("fortune", 10000, 0)]
