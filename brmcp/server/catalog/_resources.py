"""Free resources and resource templates: registration, URI matching and
read results (MCP 2025-11-25, "Resources").

Two ways to register each, as for tools:

* a function: ``async def readme(ctx: PeerContext) -> str`` for a fixed
  URI, ``async def row(ctx: PeerContext, id: str) -> dict`` for a template
  whose variables (``{id}``) name the parameters after ``ctx``;
* a spec built directly: :class:`ResourceSpec` with a handler
  ``async (ctx) -> value``, :class:`ResourceTemplateSpec` with a handler
  ``async (ctx, variables: dict) -> value``.

A handler's value becomes the ``resources/read`` result (:func:`to_read_result`).
Resources cost nothing: they are never priced or charged.
:class:`ResourceFields` and :class:`ResourceTemplateFields` declare, once,
the keyword fields both ways share.
"""

from __future__ import annotations

import inspect
import json
from base64 import b64encode
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

import pydantic
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate
from mcp.types import (
    Annotations,
    BlobResourceContents,
    ReadResourceResult,
    Resource,
    ResourceTemplate,
    TextResourceContents,
)

from ._context import PeerContext
from ._fields import spec_fields

__all__ = [
    "ResourceFields",
    "ResourceHandler",
    "ResourceSpec",
    "ResourceTemplateFields",
    "ResourceTemplateSpec",
    "TemplateHandler",
    "TemplateVariables",
    "resource_from_function",
    "resource_spec",
    "template_from_function",
    "template_spec",
    "to_read_result",
]

#: What a URI template match yields: variable name → value (a list for exploded variables).
TemplateVariables = dict[str, str | list[str]]
#: ``async (ctx) -> value`` (see :func:`to_read_result` for the values accepted).
ResourceHandler = Callable[[PeerContext], Awaitable[Any]]
#: ``async (ctx, variables) -> value`` for a URI template.
TemplateHandler = Callable[[PeerContext, TemplateVariables], Awaitable[Any]]

_Contents = TextResourceContents | BlobResourceContents


class ResourceTemplateFields(TypedDict, total=False):
    """A resource template's optional catalog fields, declared once: the
    keyword parameters of :meth:`Harness.resource_template
    <brmcp.server.Harness.resource_template>`, :meth:`Harness.add_resource_template
    <brmcp.server.Harness.add_resource_template>` and
    :func:`template_from_function`, stored as the
    :class:`ResourceTemplateSpec` fields of the same names (a resource's
    are these and ``size``: :class:`ResourceFields`).

    * ``description``: what the items are (default None; a decorated
      function's docstring);
    * ``mime_type``: advertised, and the type of a str or bytes value read
      (defaults: ``text/plain``, ``application/octet-stream``,
      ``application/json`` for other JSON values; :func:`to_read_result`);
    * ``title``, ``annotations``: the MCP fields of those names;
    * ``meta``: ``_meta`` entries of the listed entry.
    """

    description: str | None
    mime_type: str | None
    title: str | None
    annotations: Annotations | None
    meta: dict[str, Any] | None


class ResourceFields(ResourceTemplateFields, total=False):
    """A resource's optional catalog fields: those of
    :class:`ResourceTemplateFields` and ``size``, the raw content size in
    bytes when known (a whole number >= 0; default None), as the keyword
    parameters of :meth:`Harness.resource <brmcp.server.Harness.resource>`,
    :meth:`Harness.add_resource <brmcp.server.Harness.add_resource>` and
    :func:`resource_from_function`."""

    size: int | None


def _check_text(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")


def _parse_template(uri_template: str) -> UriTemplate:
    """Parse an RFC 6570 template that has at least one variable; ValueError otherwise."""
    _check_text(uri_template, "resource uri_template")
    try:
        parsed = UriTemplate.parse(uri_template)
    except InvalidUriTemplate as exc:
        raise ValueError(f'resource template "{uri_template}": {exc}') from None
    if not parsed.variable_names:
        raise ValueError(
            f'resource template "{uri_template}" has no variables; register it with add_resource'
        )
    return parsed


@dataclass(eq=False)
class ResourceSpec:
    """A resource at a fixed ``uri``, listed by ``resources/list``.

    ``mime_type`` is advertised and used for str/bytes values; ``size`` is
    the raw content size in bytes when known. Raises ValueError for an
    empty uri or name, or a negative size."""

    uri: str
    handler: ResourceHandler
    name: str
    description: str | None = None
    mime_type: str | None = None
    title: str | None = None
    size: int | None = None
    annotations: Annotations | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_text(self.uri, "resource uri")
        if UriTemplate.is_template(self.uri):
            raise ValueError(
                f'resource uri "{self.uri}" looks like a URI template; use add_resource_template'
            )
        _check_text(self.name, f'resource "{self.uri}": name')
        if self.size is not None and (
            isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0
        ):
            raise ValueError(f'resource "{self.uri}": size must be a whole number of bytes >= 0')

    def to_resource(self) -> Resource:
        """The ``resources/list`` entry."""
        return Resource(
            uri=self.uri,
            name=self.name,
            title=self.title,
            description=self.description,
            mime_type=self.mime_type,
            size=self.size,
            annotations=self.annotations,
            _meta=self.meta or None,
        )


@dataclass(eq=False)
class ResourceTemplateSpec:
    """Resources whose URIs match an RFC 6570 ``uri_template`` (e.g.
    ``"notes://{folder}/{id}"``), listed by ``resources/templates/list``.

    The handler receives the matched variables (values are caller-supplied
    text: check them before using them as paths or keys). Raises
    ValueError for an invalid template, one without variables, or an empty
    name."""

    uri_template: str
    handler: TemplateHandler
    name: str
    description: str | None = None
    mime_type: str | None = None
    title: str | None = None
    annotations: Annotations | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    _parsed: UriTemplate | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _check_text(self.name, f'resource template "{self.uri_template}": name')
        self._parsed = _parse_template(self.uri_template)

    @property
    def variable_names(self) -> list[str]:
        assert self._parsed is not None
        return self._parsed.variable_names

    def match(self, uri: str) -> TemplateVariables | None:
        """The template's variables in ``uri``, or None when it does not match."""
        assert self._parsed is not None
        return self._parsed.match(uri)

    def to_template(self) -> ResourceTemplate:
        """The ``resources/templates/list`` entry."""
        return ResourceTemplate(
            uri_template=self.uri_template,
            name=self.name,
            title=self.title,
            description=self.description,
            mime_type=self.mime_type,
            annotations=self.annotations,
            _meta=self.meta or None,
        )


def to_read_result(uri: str, mime_type: str | None, value: Any) -> ReadResourceResult:
    """Turn a resource handler's value into a ``resources/read`` result:

    * ``str`` → one text item (``mime_type``, default ``text/plain``);
    * ``bytes`` → one base64 blob item (default ``application/octet-stream``);
    * a ``TextResourceContents``/``BlobResourceContents``, or a list of them,
      → those items unchanged;
    * a ``ReadResourceResult`` → unchanged;
    * any other JSON value (dict, list, number...) → its compact JSON as text
      (default ``application/json``).

    ``uri`` is the URI that was read. Raises TypeError for a value that is
    not JSON."""
    if isinstance(value, ReadResourceResult):
        return value
    if isinstance(value, _Contents):
        return ReadResourceResult(contents=[value])
    if isinstance(value, list) and value and all(isinstance(item, _Contents) for item in value):
        return ReadResourceResult(contents=list(value))
    if isinstance(value, str):
        return ReadResourceResult(
            contents=[TextResourceContents(uri=uri, mime_type=mime_type or "text/plain", text=value)]
        )
    if isinstance(value, bytes | bytearray | memoryview):
        blob = b64encode(bytes(value)).decode("ascii")
        return ReadResourceResult(
            contents=[
                BlobResourceContents(uri=uri, mime_type=mime_type or "application/octet-stream", blob=blob)
            ]
        )
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"resource handler returned a value that is not JSON: {exc}") from None
    return ReadResourceResult(
        contents=[TextResourceContents(uri=uri, mime_type=mime_type or "application/json", text=text)]
    )


def _parameters(fn: Callable[..., Awaitable[Any]], kind: str) -> list[inspect.Parameter]:
    """The parameters after ``ctx``; TypeError for a non-async function, a
    missing ``ctx`` parameter or ``*args``/``**kwargs``."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"{kind} handler {fn.__name__!r} must be an async function")
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"{kind} handler {fn.__name__!r} must take the PeerContext as its first parameter")
    rest = params[1:]
    for param in rest:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"{kind} handler {fn.__name__!r}: *args/**kwargs are not supported")
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(f"{kind} handler {fn.__name__!r}: parameter {param.name!r} must accept a keyword")
    return rest


def resource_from_function(
    fn: Callable[..., Awaitable[Any]],
    uri: str,
    *,
    name: str | None = None,
    **fields: Unpack[ResourceFields],
) -> ResourceSpec:
    """Build a :class:`ResourceSpec` from ``async def fn(ctx: PeerContext)``;
    ``fields`` are :class:`ResourceFields`. The name defaults to the
    function's name, the description to its docstring. Raises TypeError
    when ``fn`` is not async, lacks ``ctx`` or takes other parameters
    without defaults, or for an unknown keyword; ValueError for an invalid
    uri."""
    stored = _with_doc(spec_fields(fields, ResourceFields, "resource"), fn)
    rest = _parameters(fn, "resource")
    required = [p.name for p in rest if p.default is inspect.Parameter.empty]
    if required:
        raise TypeError(
            f"resource handler {fn.__name__!r} takes only the PeerContext; "
            f"use resource_template for parameters ({', '.join(required)})"
        )

    async def handler(ctx: PeerContext) -> Any:
        return await fn(ctx)

    return ResourceSpec(uri=uri, handler=handler, name=name or fn.__name__, **stored)


def resource_spec(
    uri: str, handler: ResourceHandler, *, name: str, **fields: Unpack[ResourceFields]
) -> ResourceSpec:
    """The :class:`ResourceSpec` :meth:`Harness.add_resource
    <brmcp.server.Harness.add_resource>` registers; ``fields`` are
    :class:`ResourceFields`. Raises ValueError for an invalid uri, an empty
    name or a negative size, TypeError for an unknown keyword."""
    stored = spec_fields(fields, ResourceFields, "add_resource")
    return ResourceSpec(uri=uri, handler=handler, name=name, **stored)


def template_from_function(
    fn: Callable[..., Awaitable[Any]],
    uri_template: str,
    *,
    name: str | None = None,
    **fields: Unpack[ResourceTemplateFields],
) -> ResourceTemplateSpec:
    """Build a :class:`ResourceTemplateSpec` from ``async def fn(ctx, **variables)``;
    ``fields`` are :class:`ResourceTemplateFields`.

    The parameters after ``ctx`` must be exactly the template's variables;
    a variable missing from a URI (an optional ``{?query}`` one) leaves its
    parameter at its default. Raises TypeError for a signature that does
    not fit the template or an unknown keyword, and ValueError for an
    invalid template."""
    stored = _with_doc(spec_fields(fields, ResourceTemplateFields, "resource_template"), fn)
    rest = _parameters(fn, "resource template")
    parsed = _parse_template(uri_template)
    variables = parsed.variable_names
    params = [p.name for p in rest]
    if sorted(params) != sorted(variables):
        raise TypeError(
            f"resource template handler {fn.__name__!r}: parameters ({', '.join(params) or 'none'}) "
            f"must be the template's variables ({', '.join(variables)})"
        )
    optional = [
        p.name for p in rest if p.name in parsed.query_variable_names and p.default is inspect.Parameter.empty
    ]
    if optional:
        raise TypeError(
            f"resource template handler {fn.__name__!r}: query variables may be absent from a URI; "
            f"give {', '.join(optional)} a default"
        )

    async def handler(ctx: PeerContext, values: TemplateVariables) -> Any:
        return await fn(ctx, **{n: v for n, v in values.items() if n in variables})

    return ResourceTemplateSpec(
        uri_template=uri_template, handler=handler, name=name or fn.__name__, **stored
    )


def template_spec(
    uri_template: str, handler: TemplateHandler, *, name: str, **fields: Unpack[ResourceTemplateFields]
) -> ResourceTemplateSpec:
    """The :class:`ResourceTemplateSpec` :meth:`Harness.add_resource_template
    <brmcp.server.Harness.add_resource_template>` registers; ``fields`` are
    :class:`ResourceTemplateFields`. Raises ValueError for an invalid
    template or an empty name, TypeError for an unknown keyword."""
    stored = spec_fields(fields, ResourceTemplateFields, "add_resource_template")
    return ResourceTemplateSpec(uri_template=uri_template, handler=handler, name=name, **stored)


def _with_doc(stored: dict[str, Any], fn: Callable[..., Any]) -> dict[str, Any]:
    """``stored`` with the description defaulting to ``fn``'s docstring."""
    if stored.get("description") is None:
        stored["description"] = inspect.getdoc(fn)
    return stored
