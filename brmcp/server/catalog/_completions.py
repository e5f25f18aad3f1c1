"""Argument completion for prompts and resource templates (MCP 2025-11-25,
"Completion").

A completer is attached to one argument of one prompt (``ref/prompt``) or
one variable of one resource template (``ref/resource``, named by its URI
template): ``async def complete(ctx: PeerContext, value: str, context:
dict[str, str]) -> list[str]``. ``value`` is what the user typed so far,
``context`` the arguments already chosen. Completions are free.
:class:`CompletionFields` declares, once, what a registration names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

from mcp.types import CompleteResult, Completion

from ._context import PeerContext
from ._fields import spec_fields

__all__ = [
    "MAX_COMPLETION_VALUES",
    "Completer",
    "CompletionFields",
    "CompletionSpec",
    "completion_spec",
    "to_completion",
]

#: The most values one completion result may carry (MCP "Completion": at most 100).
MAX_COMPLETION_VALUES = 100

#: ``async (ctx, value, context_arguments) -> list[str] | Completion | CompleteResult``
Completer = Callable[[PeerContext, str, dict[str, str]], Awaitable[Any]]


@dataclass(frozen=True, eq=False)
class CompletionSpec:
    """A completer for ``argument`` of the prompt named ``ref`` (``kind``
    ``"prompt"``) or of the resource template whose URI template is ``ref``
    (``kind`` ``"resource"``). Raises ValueError for an empty ref or
    argument or an unknown kind."""

    kind: Literal["prompt", "resource"]
    ref: str
    argument: str
    handler: Completer

    def __post_init__(self) -> None:
        if self.kind not in ("prompt", "resource"):
            raise ValueError(f"completion kind must be 'prompt' or 'resource', not {self.kind!r}")
        if not isinstance(self.ref, str) or not self.ref:
            raise ValueError("completion ref must be a non-empty prompt name or URI template")
        if not isinstance(self.argument, str) or not self.argument:
            raise ValueError("completion argument must be a non-empty string")

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.ref, self.argument)


class _CompletionRef(TypedDict, total=False):
    """What a completion belongs to: one of a prompt or a URI template."""

    prompt: str | None
    resource_template: str | None


class CompletionFields(_CompletionRef):
    """What a completer completes, declared once: the keyword parameters of
    :meth:`Harness.completion <brmcp.server.Harness.completion>` and
    :meth:`Harness.add_completion <brmcp.server.Harness.add_completion>`.

    * ``argument`` (required): the argument (or template variable) completed;
    * ``prompt``: the name of the prompt it belongs to, or
    * ``resource_template``: the URI template it belongs to (``ref/resource``);

    exactly one of ``prompt`` and ``resource_template`` is given.
    """

    argument: str


def completion_spec(handler: Completer, **fields: Unpack[CompletionFields]) -> CompletionSpec:
    """The :class:`CompletionSpec` of ``handler`` for ``fields``
    (:class:`CompletionFields`). Raises ValueError when not exactly one of
    ``prompt``/``resource_template`` is given or for an empty ref or
    argument, TypeError for an unknown or missing keyword."""
    given = spec_fields(fields, CompletionFields, "add_completion")
    prompt, resource_template = given.get("prompt"), given.get("resource_template")
    if (prompt is None) == (resource_template is None):
        raise ValueError("add_completion: give exactly one of prompt= or resource_template=")
    if prompt is not None:
        return CompletionSpec(kind="prompt", ref=prompt, argument=given["argument"], handler=handler)
    assert resource_template is not None
    return CompletionSpec(kind="resource", ref=resource_template, argument=given["argument"], handler=handler)


def to_completion(value: Any) -> CompleteResult:
    """Turn a completer's value into a ``completion/complete`` result: a
    list of strings keeps its first :data:`MAX_COMPLETION_VALUES` and
    reports ``total`` and ``hasMore``; a ``Completion`` or ``CompleteResult``
    passes unchanged. Raises TypeError for anything else."""
    if isinstance(value, CompleteResult):
        return value
    if isinstance(value, Completion):
        return CompleteResult(completion=value)
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        values = list(value)
        shown = values[:MAX_COMPLETION_VALUES]
        return CompleteResult(
            completion=Completion(values=shown, total=len(values), has_more=len(values) > len(shown))
        )
    raise TypeError(f"completion handler returned {type(value).__name__}; expected a list of strings")
