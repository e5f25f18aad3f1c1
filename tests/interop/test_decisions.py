"""Decisions on the MCP-layer differences from the Go reference that hold
without Go present (docs/interop.md "Differences and decisions"; the
tests in tests/interop compare them against the reference itself)."""

from __future__ import annotations

import json
from pathlib import Path

from brmcp.serve.tools import register_tools
from brmcp.server import Harness, HarnessConfig
from brmcp.server.catalog import to_result


def test_tool_result_text_escapes_html_characters_as_go() -> None:
    value = {"echo": "<a&b> é \u2028\u2029", "n": 1}
    result = to_result(value)
    text = result.content[0].text  # type: ignore[union-attr]
    assert text == '{"echo":"\\u003ca\\u0026b\\u003e é \\u2028\\u2029","n":1}'
    assert json.loads(text) == value
    assert result.structured_content == value


def test_plain_string_results_are_not_escaped() -> None:
    result = to_result("<b>bold</b> & more")
    assert result.content[0].text == "<b>bold</b> & more"  # type: ignore[union-attr]
    assert result.structured_content is None


def test_example_tools_advertise_no_output_schema(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers=()))
    register_tools(harness)
    specs = {spec.name: spec for spec in harness.tools()}
    assert set(specs) == {"echo", "fortune"}
    assert all(spec.output_schema is None for spec in specs.values())
    assert specs["echo"].input_schema == {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "the text to echo back"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    assert specs["fortune"].input_schema == {"type": "object", "additionalProperties": False}
    assert specs["fortune"].price_atoms == 10_000
