"""Tool registration: schemas, argument validation, prices, results.

Two ways to register (WIRE.md §Payments "Prices in tools/list" for the
``_meta`` rules):

* :func:`spec_from_function` derives the input schema from a handler's type
  hints: ``async def fortune(ctx: CallContext, topic: str = "") -> dict``;
* :class:`ToolSpec` built directly from a JSON Schema and a handler
  ``async (ctx, args: dict) -> dict | str | CallToolResult``.

:class:`ToolFields` declares, once, the keyword fields both ways share.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

import jsonschema
import pydantic
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from brmcp._ops import gojson as _gojson
from brmcp.protocol.payment import PRICE_ATOMS_KEY, PRICING_KEY

from ._context import CallContext
from ._fields import spec_fields

__all__ = [
    "Handler",
    "PriceFunc",
    "ToolArgumentError",
    "ToolFields",
    "ToolSpec",
    "spec_from_function",
    "to_result",
    "tool_spec",
]

#: ``async (ctx, args) -> dict | str | CallToolResult | JSON value``
Handler = Callable[[CallContext, dict[str, Any]], Awaitable[Any]]
#: ``(ctx, args) -> atoms`` (may be async); runs after the rate limit, before the charge.
PriceFunc = Callable[[CallContext, dict[str, Any]], "int | Awaitable[int]"]


class ToolArgumentError(ValueError):
    """Arguments do not satisfy the tool's input schema."""


class ToolFields(TypedDict, total=False):
    """A tool's optional catalog fields, declared once: the keyword
    parameters of :meth:`Harness.tool <brmcp.server.Harness.tool>`,
    :meth:`Harness.add_tool <brmcp.server.Harness.add_tool>` and
    :func:`spec_from_function`, stored as the :class:`ToolSpec` fields of the
    same names.

    * ``output_schema``: a JSON Schema (an object) that a successful
      result's ``structuredContent`` must match; a result that does not is
      a tool error (refunded when paid). Default None: unchecked.
    * ``price_atoms``: the fixed price per call, whole atoms >= 0 (default
      0: free), advertised as ``_meta["brmcp/priceAtoms"]`` (WIRE.md
      §Payments "Prices in tools/list"); ignored when ``price`` is set.
    * ``price``: ``(ctx, args) -> atoms`` (may be async), run after the rate
      limit and before the charge; the tool is advertised with
      ``"brmcp/pricing": "dynamic"`` unless ``meta`` names a price key.
    * ``annotations``, ``title``: the MCP ``Tool`` fields of those names.
    * ``meta``: more ``_meta`` entries for the ``tools/list`` entry.

    Registration raises ValueError for a negative or non-integer
    ``price_atoms`` or an invalid ``output_schema`` (see :class:`ToolSpec`).
    """

    output_schema: dict[str, Any] | None
    price_atoms: int
    price: PriceFunc | None
    annotations: ToolAnnotations | None
    title: str | None
    meta: dict[str, Any] | None


@dataclass(eq=False)
class ToolSpec:
    """A registered tool. ``price_atoms`` is the fixed price (ignored when
    ``price`` is set); the advertised ``_meta`` follows WIRE.md §Payments."""

    name: str
    handler: Handler
    description: str | None
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    price_atoms: int = 0
    price: PriceFunc | None = None
    annotations: ToolAnnotations | None = None
    title: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: Turns validated JSON arguments into what the handler receives.
    converter: Callable[[dict[str, Any]], dict[str, Any]] | None = field(default=None, repr=False)
    _validator: Any = field(default=None, repr=False)
    _output_validator: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("tool name must be a non-empty string")
        if not isinstance(self.input_schema, dict) or self.input_schema.get("type") != "object":
            raise ValueError(f'tool "{self.name}": input_schema must be a JSON Schema with "type": "object"')
        fixed = self.price_atoms
        if self.price is None and (isinstance(fixed, bool) or not isinstance(fixed, int) or fixed < 0):
            raise ValueError(f'tool "{self.name}": price_atoms must be a whole number of atoms >= 0')
        validator_cls = jsonschema.validators.validator_for(
            self.input_schema, jsonschema.Draft202012Validator
        )
        try:
            validator_cls.check_schema(self.input_schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f'tool "{self.name}": invalid input_schema: {exc.message}') from exc
        self._validator = validator_cls(self.input_schema)
        if self.output_schema is not None:
            out_cls = jsonschema.validators.validator_for(self.output_schema, jsonschema.Draft202012Validator)
            try:
                out_cls.check_schema(self.output_schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f'tool "{self.name}": invalid output_schema: {exc.message}') from exc
            self._output_validator = out_cls(self.output_schema)
        meta = dict(self.meta)
        if self.price is None:
            meta[PRICE_ATOMS_KEY] = self.price_atoms
        elif PRICE_ATOMS_KEY not in meta and PRICING_KEY not in meta:
            meta[PRICING_KEY] = "dynamic"
        self.meta = meta

    def to_tool(self) -> Tool:
        """The tools/list entry."""
        return Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            annotations=self.annotations,
            _meta=self.meta,
        )

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check ``arguments`` against the input schema and return what the
        handler receives. Raises :class:`ToolArgumentError` with a readable
        message naming the problem (WIRE.md §Payments, "Before the server
        order": validation happens before any rate limit, price or charge)."""
        try:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        except RecursionError:
            raise ToolArgumentError('validating "arguments": nested too deeply') from None
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            # Keys are caller-controlled: bound the path as well as the message.
            at = f" at /{_shorten(where, 120)}" if where else ""
            raise ToolArgumentError(f'validating "arguments"{at}: {_shorten(error.message)}')
        if self.converter is not None:
            return self.converter(arguments)
        return arguments

    def check_output(self, result: CallToolResult) -> str | None:
        """A reason when a successful result's structuredContent violates the
        output schema, else None."""
        if self._output_validator is None or result.is_error:
            return None
        if result.structured_content is None:
            return "tool declared an output schema but returned no structured content"
        error = jsonschema.exceptions.best_match(
            self._output_validator.iter_errors(result.structured_content)
        )
        if error is None:
            return None
        return f"tool output does not match its output schema: {_shorten(error.message)}"

    async def price_for(self, ctx: CallContext, arguments: dict[str, Any]) -> int:
        """Atoms this call costs; raises whatever the price function raises,
        or ValueError for a non-integer price."""
        if self.price is None:
            return self.price_atoms
        value = self.price(ctx, arguments)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"price function returned {type(value).__name__}, not an integer number of atoms"
            )
        return value


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def to_result(value: Any) -> CallToolResult:
    """Turn a handler's return value into a CallToolResult: a dict becomes
    structuredContent plus its compact JSON as text, written as the Go SDK
    writes it (``<``, ``>``, ``&``, U+2028 and U+2029 escaped as
    ``\\u003c``…, docs/interop.md); a str becomes a single text content; a
    CallToolResult passes unchanged. Raises TypeError for values that are
    not JSON."""
    if isinstance(value, CallToolResult):
        return value
    if isinstance(value, str):
        return CallToolResult(content=[TextContent(type="text", text=value)])
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"tool returned a value that is not JSON: {exc}") from None
    text = _gojson.html_escape(text)
    structured = value if isinstance(value, dict) else None
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


# -- schema derivation from type hints ---------------------------------------------

_NAME_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def _strip_titles(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _NAME_MAPS and isinstance(value, dict):
            out[key] = {name: _strip_titles(schema) for name, schema in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def spec_from_function(
    fn: Callable[..., Awaitable[Any]],
    *,
    name: str | None = None,
    description: str | None = None,
    **fields: Unpack[ToolFields],
) -> ToolSpec:
    """Build a :class:`ToolSpec` from ``async def fn(ctx: CallContext, ...)``.

    Parameters after ``ctx`` become the input schema's properties (those
    without defaults are required; unknown arguments are rejected:
    ``additionalProperties: false``). Arguments are converted to the
    annotated types before the call. The name defaults to the function's
    name, the description to its docstring; ``fields`` are
    :class:`ToolFields`. Raises TypeError for a non-async function, a
    missing ``ctx`` parameter or an unknown keyword.
    """
    stored = spec_fields(fields, ToolFields, "spec_from_function")
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"tool handler {fn.__name__!r} must be an async function")
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"tool handler {fn.__name__!r} must take the CallContext as its first parameter")
    hints = typing.get_type_hints(fn, include_extras=True)
    arguments: dict[str, Any] = {}
    for param in params[1:]:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"tool handler {fn.__name__!r}: *args/**kwargs are not supported")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        arguments[param.name] = (annotation, default)
    model = pydantic.create_model(
        f"{fn.__name__}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **arguments,
    )
    schema = _strip_titles(model.model_json_schema())
    if not schema.get("properties"):
        schema.pop("properties", None)
        schema.pop("required", None)
    schema["additionalProperties"] = False
    names = list(arguments)

    def convert(given: dict[str, Any]) -> dict[str, Any]:
        try:
            parsed = model.model_validate(given)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = "/".join(str(p) for p in first.get("loc", ()))
            raise ToolArgumentError(
                f'validating "arguments" at /{_shorten(where, 120)}: {_shorten(str(first.get("msg")))}'
            ) from None
        return {n: getattr(parsed, n) for n in names}

    async def handler(ctx: CallContext, kwargs: dict[str, Any]) -> Any:
        return await fn(ctx, **kwargs)

    doc = inspect.getdoc(fn)
    return ToolSpec(
        name=name or fn.__name__,
        handler=handler,
        description=description if description is not None else doc,
        input_schema=schema,
        converter=convert,
        **stored,
    )


def tool_spec(
    name: str,
    handler: Handler,
    *,
    description: str | None,
    input_schema: dict[str, Any],
    **fields: Unpack[ToolFields],
) -> ToolSpec:
    """A :class:`ToolSpec` from a JSON Schema and a handler ``(ctx, args)``
    (what :meth:`Harness.add_tool <brmcp.server.Harness.add_tool>`
    registers); ``fields`` are :class:`ToolFields`. Raises ValueError for an
    invalid schema or a negative price, TypeError for an unknown keyword."""
    stored = spec_fields(fields, ToolFields, "add_tool")
    return ToolSpec(name=name, handler=handler, description=description, input_schema=input_schema, **stored)
