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
"""

from __future__ import annotations

import inspect
import json
from base64 import b64encode
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

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

from .context import PeerContext

__all__ = [
    "ResourceHandler",
    "ResourceSpec",
    "ResourceTemplateSpec",
    "TemplateHandler",
    "TemplateVariables",
    "resource_from_function",
    "template_from_function",
    "to_read_result",
]

#: What a URI template match yields: variable name → value (a list for exploded variables).
TemplateVariables = dict[str, str | list[str]]
#: ``async (ctx) -> value`` (see :func:`to_read_result` for the values accepted).
ResourceHandler = Callable[[PeerContext], Awaitable[Any]]
#: ``async (ctx, variables) -> value`` for a URI template.
TemplateHandler = Callable[[PeerContext, TemplateVariables], Awaitable[Any]]

_Contents = TextResourceContents | BlobResourceContents


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
    description: str | None = None,
    mime_type: str | None = None,
    title: str | None = None,
    size: int | None = None,
    annotations: Annotations | None = None,
    meta: dict[str, Any] | None = None,
) -> ResourceSpec:
    """Build a :class:`ResourceSpec` from ``async def fn(ctx: PeerContext)``.
    The name defaults to the function's name, the description to its
    docstring. Raises TypeError when ``fn`` is not async, lacks ``ctx`` or
    takes other parameters without defaults."""
    rest = _parameters(fn, "resource")
    required = [p.name for p in rest if p.default is inspect.Parameter.empty]
    if required:
        raise TypeError(
            f"resource handler {fn.__name__!r} takes only the PeerContext; "
            f"use resource_template for parameters ({', '.join(required)})"
        )

    async def handler(ctx: PeerContext) -> Any:
        return await fn(ctx)

    return ResourceSpec(
        uri=uri,
        handler=handler,
        name=name or fn.__name__,
        description=description if description is not None else inspect.getdoc(fn),
        mime_type=mime_type,
        title=title,
        size=size,
        annotations=annotations,
        meta=dict(meta or {}),
    )


def template_from_function(
    fn: Callable[..., Awaitable[Any]],
    uri_template: str,
    *,
    name: str | None = None,
    description: str | None = None,
    mime_type: str | None = None,
    title: str | None = None,
    annotations: Annotations | None = None,
    meta: dict[str, Any] | None = None,
) -> ResourceTemplateSpec:
    """Build a :class:`ResourceTemplateSpec` from ``async def fn(ctx, **variables)``.

    The parameters after ``ctx`` must be exactly the template's variables;
    a variable missing from a URI (an optional ``{?query}`` one) leaves its
    parameter at its default. Raises TypeError for a signature that does
    not fit the template and ValueError for an invalid template."""
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
        uri_template=uri_template,
        handler=handler,
        name=name or fn.__name__,
        description=description if description is not None else inspect.getdoc(fn),
        mime_type=mime_type,
        title=title,
        annotations=annotations,
        meta=dict(meta or {}),
    )
