"""The catalog's keyword fields are declared once per kind
(brmcp/server/catalog/_fields.py, the ``*Fields`` TypedDicts beside each spec):
every declared field lands on the kind's spec under its own name, ``meta``
is copied, and an unknown or missing keyword is refused with TypeError
when the registering method is called, as when the parameters were spelled
out one by one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from brmcp.server import CallContext, Harness, HarnessConfig, PeerContext
from brmcp.server.catalog import (
    CompletionFields,
    PromptFields,
    PromptSpec,
    ResourceFields,
    ResourceSpec,
    ResourceTemplateFields,
    ResourceTemplateSpec,
    ToolFields,
    ToolSpec,
)
from tests.kit.harness import ALICE

KINDS: list[tuple[Any, Any]] = [
    (ToolFields, ToolSpec),
    (ResourceFields, ResourceSpec),
    (ResourceTemplateFields, ResourceTemplateSpec),
    (PromptFields, PromptSpec),
]


def _keys(declared: Any) -> set[str]:
    return set(declared.__required_keys__ | declared.__optional_keys__)


def test_every_declared_field_is_a_field_of_its_spec() -> None:
    for declared, spec in KINDS:
        assert _keys(declared) <= {f.name for f in dataclasses.fields(spec)}, declared.__name__
    assert _keys(ResourceFields) == _keys(ResourceTemplateFields) | {"size"}
    assert _keys(CompletionFields) == {"argument", "prompt", "resource_template"}
    assert CompletionFields.__required_keys__ == {"argument"}


async def _read(ctx: PeerContext) -> str:
    return "x"


async def test_every_field_given_reaches_the_spec(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    meta = {"example/key": 1}
    annotations = types.ToolAnnotations(read_only_hint=True)

    @harness.tool(
        description="d",
        price_atoms=5,
        output_schema={"type": "object"},
        annotations=annotations,
        title="T",
        meta=meta,
    )
    async def decorated(ctx: CallContext) -> dict[str, Any]:
        return {}

    async def explicit(ctx: CallContext, args: dict[str, Any]) -> str:
        return ""

    harness.add_tool(
        "explicit", explicit, description=None, input_schema={"type": "object"}, price=lambda c, a: 3
    )
    harness.add_resource("memo://a", _read, name="a", mime_type="text/markdown", size=7, meta=meta)
    harness.resource("memo://b", title="B")(_read)
    harness.add_resource_template("notes://{id}", lambda ctx, v: _read(ctx), name="n", mime_type="text/plain")
    harness.add_prompt("p", lambda ctx, a: _read(ctx), description="P", title="PT", meta=None)
    async with harness:
        first, second = harness.tools()
        assert (first.name, first.description, first.price_atoms, first.title) == ("decorated", "d", 5, "T")
        assert (first.output_schema, first.annotations) == ({"type": "object"}, annotations)
        assert first.meta == {"example/key": 1, "brmcp/priceAtoms": 5}
        assert (second.name, second.description, second.meta) == (
            "explicit",
            None,
            {"brmcp/pricing": "dynamic"},
        )
        resource_a, resource_b = harness.resources()
        assert (resource_a.mime_type, resource_a.size, resource_a.meta) == ("text/markdown", 7, meta)
        assert resource_a.meta is not meta  # copied
        assert (resource_b.name, resource_b.title, resource_b.meta) == ("_read", "B", {})
        (template,) = harness.resource_templates()
        assert (template.name, template.mime_type) == ("n", "text/plain")
        (prompt,) = harness.prompts()
        assert (prompt.description, prompt.title, prompt.meta) == ("P", "PT", {})


async def test_an_unknown_or_missing_keyword_is_refused_at_the_call(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    schema = {"type": "object"}
    refused = [
        lambda: harness.tool(descripton="typo"),  # type: ignore[call-arg]
        lambda: harness.add_tool("t", _read, description=None, input_schema=schema, cost=1),  # type: ignore[call-arg]
        lambda: harness.resource("memo://c", mimetype="text/plain"),  # type: ignore[call-arg]
        lambda: harness.resource_template("notes://{id}", size=1),  # type: ignore[call-arg]
        lambda: harness.prompt(arguments=[]),  # type: ignore[call-arg]
        lambda: harness.completion(prompt="p"),  # type: ignore[call-arg]
        lambda: harness.add_completion(_read, argument="a", prompt="p", extra=1),  # type: ignore[call-arg]
    ]
    async with harness:
        for register in refused:
            with pytest.raises(TypeError, match="keyword argument"):
                register()
        assert harness.tools() == []
        assert harness.resources() == []
        assert harness.prompts() == []
        with pytest.raises(ValueError, match="exactly one of"):
            harness.add_completion(_read, argument="a")
