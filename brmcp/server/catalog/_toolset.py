"""The harness's tools: registration (a decorated function, a JSON Schema
and a handler, or a prepared :class:`~.tools.ToolSpec`), removal, and what
one caller sees of them (``HarnessConfig.tool_visible``: a hidden tool is
absent from ``tools/list`` and unknown to ``tools/call``). Owned by
:class:`~.harness.Harness`, whose tool methods delegate here; the keyword
fields are :class:`~.tools.ToolFields` (WIRE.md §Payments "Prices in
tools/list" for the ``_meta`` they advertise).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, Unpack

from mcp.types import Tool

from brmcp.server.config import HarnessConfig

from ._fields import spec_fields
from ._tools import Handler, ToolFields, ToolSpec, spec_from_function, tool_spec

__all__ = ["Toolset"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class Toolset:
    """The registered tools in registration order; ``config`` is the
    harness's (``tool_visible`` read live)."""

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self._specs: dict[str, ToolSpec] = {}

    def tool(
        self, name: str | None = None, *, description: str | None = None, **fields: Unpack[ToolFields]
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: CallContext, ...)``; the
        input schema comes from the type hints (see
        :func:`~.tools.spec_from_function`), the name defaults to the
        function's and the description to its docstring. Raises TypeError
        for a bad signature or keyword, ValueError for a negative price or a
        duplicate name."""
        spec_fields(fields, ToolFields, "tool")

        def register(fn: F) -> F:
            self.add_spec(spec_from_function(fn, name=name, description=description, **fields))
            return fn

        return register

    def add_tool(
        self,
        name: str,
        handler: Handler,
        *,
        description: str | None,
        input_schema: dict[str, Any],
        **fields: Unpack[ToolFields],
    ) -> None:
        """Register a tool with an explicit JSON Schema (an object schema);
        ``handler(ctx, args)`` returns a dict (structured result), a str, or
        a CallToolResult. Raises ValueError for an invalid schema, a
        negative price or a duplicate name."""
        self.add_spec(tool_spec(name, handler, description=description, input_schema=input_schema, **fields))

    def add_spec(self, spec: ToolSpec, *, replace: bool = False) -> None:
        """Register a prepared spec; with ``replace`` an existing tool of
        that name is replaced (calls already running finish with the old
        spec). Raises ValueError for a duplicate name without ``replace``."""
        if not replace and spec.name in self._specs:
            raise ValueError(f'tool "{spec.name}" is already registered')
        self._specs[spec.name] = spec

    def remove(self, name: str) -> bool:
        """Unregister ``name``; returns whether it existed."""
        return self._specs.pop(name, None) is not None

    def specs(self) -> list[ToolSpec]:
        """Every registered tool, in registration order."""
        return list(self._specs.values())

    def visible(self, peer: str, name: str) -> bool:
        """Whether ``peer`` may see (and call) the tool ``name``."""
        fn = self.config.tool_visible
        return fn is None or bool(fn(peer, name))

    def lookup(self, peer: str, name: str) -> ToolSpec | None:
        """The tool ``name`` as ``peer`` may call it; None when it is
        unknown or hidden from ``peer``."""
        spec = self._specs.get(name)
        return spec if spec is not None and self.visible(peer, name) else None

    def listed(self, peer: str) -> list[Tool]:
        """The ``tools/list`` entries ``peer`` sees, in registration order."""
        return [spec.to_tool() for spec in self._specs.values() if self.visible(peer, spec.name)]
