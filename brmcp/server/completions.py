"""Argument completion for prompts and resource templates (MCP 2025-11-25,
"Completion").

A completer is attached to one argument of one prompt (``ref/prompt``) or
one variable of one resource template (``ref/resource``, named by its URI
template): ``async def complete(ctx: PeerContext, value: str, context:
dict[str, str]) -> list[str]``. ``value`` is what the user typed so far,
``context`` the arguments already chosen. Completions are free.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from mcp.types import CompleteResult, Completion

from .context import PeerContext

__all__ = ["MAX_COMPLETION_VALUES", "Completer", "CompletionSpec", "to_completion"]

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
