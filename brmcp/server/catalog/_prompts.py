"""Free prompts: registration, argument checks and ``prompts/get`` results
(MCP 2025-11-25, "Prompts").

Two ways to register, as for tools:

* a function: ``async def review(ctx: PeerContext, code: str, style: str = "terse") -> str``;
  the parameters after ``ctx`` become the prompt's arguments (required
  unless they have a default). Prompt arguments are strings on the wire, so
  parameters must be ``str`` (or ``str | None``). A description can be
  attached with ``Annotated[str, "what it is"]`` or
  ``Annotated[str, pydantic.Field(description=...)]``;
* :class:`PromptSpec` built directly, with a handler ``async (ctx, args: dict[str, str])``.

A handler's value becomes the result (:func:`to_prompt_result`).
:class:`PromptFields` declares, once, the keyword fields both ways share.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from mcp.types import (
    AudioContent,
    EmbeddedResource,
    GetPromptResult,
    ImageContent,
    Prompt,
    PromptArgument,
    PromptMessage,
    ResourceLink,
    TextContent,
)

from ._context import PeerContext
from ._fields import spec_fields

__all__ = [
    "PromptArgumentError",
    "PromptFields",
    "PromptHandler",
    "PromptSpec",
    "prompt_from_function",
    "prompt_spec",
    "to_prompt_result",
]

#: ``async (ctx, arguments) -> value`` (see :func:`to_prompt_result`).
PromptHandler = Callable[[PeerContext, dict[str, str]], Awaitable[Any]]

_CONTENT = (TextContent, ImageContent, AudioContent, ResourceLink, EmbeddedResource)


class PromptArgumentError(ValueError):
    """The arguments of a ``prompts/get`` do not fit the prompt."""


class PromptFields(TypedDict, total=False):
    """A prompt's optional catalog fields, declared once: the keyword
    parameters of :meth:`Harness.prompt <brmcp.server.Harness.prompt>`,
    :meth:`Harness.add_prompt <brmcp.server.Harness.add_prompt>` and
    :func:`prompt_from_function`, stored as the :class:`PromptSpec` fields
    of the same names.

    * ``description``: what the prompt is for (default None; a decorated
      function's docstring), also set on the results built from its values;
    * ``title``: the MCP ``Prompt`` field;
    * ``meta``: ``_meta`` entries of the ``prompts/list`` entry.
    """

    description: str | None
    title: str | None
    meta: dict[str, Any] | None


@dataclass(eq=False)
class PromptSpec:
    """A registered prompt. ``arguments`` are advertised by ``prompts/list``
    and checked before the handler runs. Raises ValueError for an empty
    name or duplicate argument names."""

    name: str
    handler: PromptHandler
    description: str | None = None
    arguments: list[PromptArgument] = field(default_factory=list)
    title: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("prompt name must be a non-empty string")
        names = [arg.name for arg in self.arguments]
        if len(set(names)) != len(names):
            raise ValueError(f'prompt "{self.name}": argument names must be unique')

    def to_prompt(self) -> Prompt:
        """The ``prompts/list`` entry."""
        return Prompt(
            name=self.name,
            title=self.title,
            description=self.description,
            arguments=list(self.arguments) or None,
            _meta=self.meta or None,
        )

    def check_arguments(self, given: dict[str, str] | None) -> dict[str, str]:
        """The arguments the handler receives. Raises
        :class:`PromptArgumentError` naming an unknown or missing argument."""
        values = dict(given or {})
        known = {arg.name for arg in self.arguments}
        for key in values:
            if key not in known:
                raise PromptArgumentError(f'prompt "{self.name}": unknown argument "{_shorten(key)}"')
        for arg in self.arguments:
            if arg.required and arg.name not in values:
                raise PromptArgumentError(f'prompt "{self.name}": missing required argument "{arg.name}"')
        return values


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def to_prompt_result(value: Any, description: str | None = None) -> GetPromptResult:
    """Turn a prompt handler's value into a ``prompts/get`` result:

    * ``GetPromptResult`` → unchanged;
    * ``str`` → one user message with that text;
    * a content block (text, image, audio, resource link, embedded
      resource) → one user message holding it;
    * a ``PromptMessage`` → that message;
    * a list of any of these → the messages in order.

    ``description`` (the prompt's) is set on results built here. Raises
    TypeError for anything else."""
    if isinstance(value, GetPromptResult):
        return value
    items = value if isinstance(value, list | tuple) else [value]
    messages = [_message(item) for item in items]
    return GetPromptResult(description=description, messages=messages)


def _message(item: Any) -> PromptMessage:
    if isinstance(item, PromptMessage):
        return item
    if isinstance(item, str):
        return PromptMessage(role="user", content=TextContent(type="text", text=item))
    if isinstance(item, _CONTENT):
        return PromptMessage(role="user", content=item)
    raise TypeError(f"prompt handler returned {type(item).__name__}; expected str, content or PromptMessage")


def _is_text(annotation: Any) -> bool:
    if annotation is Any or annotation is str:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return all(arg is str or arg is type(None) for arg in typing.get_args(annotation))
    return False


def _description(metadata: tuple[Any, ...]) -> str | None:
    for item in metadata:
        if isinstance(item, str):
            return item
        text = getattr(item, "description", None)
        if isinstance(text, str):
            return text
    return None


def prompt_from_function(
    fn: Callable[..., Awaitable[Any]],
    *,
    name: str | None = None,
    **fields: Unpack[PromptFields],
) -> PromptSpec:
    """Build a :class:`PromptSpec` from ``async def fn(ctx: PeerContext, ...)``;
    ``fields`` are :class:`PromptFields`. The name defaults to the
    function's name, the description to its docstring. Raises TypeError for
    a non-async function, a missing ``ctx`` parameter, ``*args``/``**kwargs``,
    a parameter that is not a string or an unknown keyword."""
    stored = spec_fields(fields, PromptFields, "prompt")
    if stored.get("description") is None:
        stored["description"] = inspect.getdoc(fn)
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"prompt handler {fn.__name__!r} must be an async function")
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"prompt handler {fn.__name__!r} must take the PeerContext as its first parameter")
    hints = typing.get_type_hints(fn, include_extras=True)
    arguments: list[PromptArgument] = []
    for param in params[1:]:
        if param.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            raise TypeError(f"prompt handler {fn.__name__!r}: parameter {param.name!r} must accept a keyword")
        annotation = hints.get(param.name, Any)
        metadata: tuple[Any, ...] = ()
        if typing.get_origin(annotation) is typing.Annotated:
            annotation, *extra = typing.get_args(annotation)
            metadata = tuple(extra)
        if not _is_text(annotation):
            raise TypeError(
                f"prompt handler {fn.__name__!r}: parameter {param.name!r} must be a str "
                "(prompt arguments are strings)"
            )
        arguments.append(
            PromptArgument(
                name=param.name,
                description=_description(metadata),
                required=param.default is inspect.Parameter.empty,
            )
        )

    async def handler(ctx: PeerContext, values: dict[str, str]) -> Any:
        return await fn(ctx, **values)

    return PromptSpec(name=name or fn.__name__, handler=handler, arguments=arguments, **stored)


def prompt_spec(
    name: str,
    handler: PromptHandler,
    *,
    arguments: Iterable[PromptArgument] = (),
    **fields: Unpack[PromptFields],
) -> PromptSpec:
    """The :class:`PromptSpec` :meth:`Harness.add_prompt
    <brmcp.server.Harness.add_prompt>` registers: ``arguments`` are
    advertised and checked before ``handler`` runs; ``fields`` are
    :class:`PromptFields`. Raises ValueError for an empty name or duplicate
    argument names, TypeError for an unknown keyword."""
    stored = spec_fields(fields, PromptFields, "add_prompt")
    return PromptSpec(name=name, handler=handler, arguments=list(arguments), **stored)
