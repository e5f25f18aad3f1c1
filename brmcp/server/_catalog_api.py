"""The harness's public surface for its free catalog (not in the Go
harness): registering resources, resource templates, prompts and
completions, and notifying sessions of their changes. :class:`CatalogMethods`
is a mixin of :class:`~.harness.Harness` over its :class:`~.catalog.Catalog`
(which serves them; brmcp/server/catalog.py).

Registering the first item of a kind makes new sessions declare its
capability (resources: subscribe + listChanged; prompts: listChanged;
completions); a harness with tools only declares ``{"tools": ...}`` alone.
Every allowed peer sees every item (``tool_visible`` is for tools only).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from mcp.server import ServerRequestContext
from mcp.types import Annotations, PromptArgument

from .catalog import Catalog, SessionState
from .completions import Completer, CompletionSpec
from .prompts import PromptHandler, PromptSpec, prompt_from_function
from .resources import (
    ResourceHandler,
    ResourceSpec,
    ResourceTemplateSpec,
    TemplateHandler,
    resource_from_function,
    template_from_function,
)

__all__ = ["CatalogMethods"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class CatalogMethods:
    """Resources, resource templates, prompts and completions of a
    harness: every method works on ``_catalog``, which the harness sets."""

    _catalog: Catalog

    def resource(
        self,
        uri: str,
        *,
        name: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
        title: str | None = None,
        size: int | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext)`` as the
        resource at ``uri``; its value becomes the read result (str → text,
        bytes → blob, dict → JSON text; see :func:`~.resources.to_read_result`).
        The name defaults to the function's name. Raises TypeError for a
        bad signature, ValueError for a duplicate or invalid uri."""

        def register(fn: F) -> F:
            self._catalog.add_resource(
                resource_from_function(
                    fn,
                    uri,
                    name=name,
                    description=description,
                    mime_type=mime_type,
                    title=title,
                    size=size,
                    annotations=annotations,
                    meta=meta,
                )
            )
            return fn

        return register

    def add_resource(
        self,
        uri: str,
        handler: ResourceHandler,
        *,
        name: str,
        description: str | None = None,
        mime_type: str | None = None,
        title: str | None = None,
        size: int | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Register the resource at ``uri``: ``handler(ctx)`` returns its
        contents (see :meth:`resource`). Raises ValueError for a duplicate
        or invalid uri or an empty name."""
        self._catalog.add_resource(
            ResourceSpec(
                uri=uri,
                handler=handler,
                name=name,
                description=description,
                mime_type=mime_type,
                title=title,
                size=size,
                annotations=annotations,
                meta=dict(meta or {}),
            )
        )

    def resource_template(
        self,
        uri_template: str,
        *,
        name: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
        title: str | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, **variables)``
        for the URIs matching the RFC 6570 ``uri_template`` (e.g.
        ``"notes://{folder}/{id}"``); the parameters after ``ctx`` must be
        the template's variables. Raises TypeError for a bad signature,
        ValueError for a duplicate or invalid template."""

        def register(fn: F) -> F:
            self._catalog.add_template(
                template_from_function(
                    fn,
                    uri_template,
                    name=name,
                    description=description,
                    mime_type=mime_type,
                    title=title,
                    annotations=annotations,
                    meta=meta,
                )
            )
            return fn

        return register

    def add_resource_template(
        self,
        uri_template: str,
        handler: TemplateHandler,
        *,
        name: str,
        description: str | None = None,
        mime_type: str | None = None,
        title: str | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Register a resource template: ``handler(ctx, variables)`` gets
        the variables matched in the URI read (``ctx.target``). Raises
        ValueError for a duplicate or invalid template or an empty name."""
        self._catalog.add_template(
            ResourceTemplateSpec(
                uri_template=uri_template,
                handler=handler,
                name=name,
                description=description,
                mime_type=mime_type,
                title=title,
                annotations=annotations,
                meta=dict(meta or {}),
            )
        )

    def prompt(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, arg: str, ...)``
        as a prompt; the str parameters after ``ctx`` are its arguments
        (required unless defaulted). The value becomes the messages (str →
        one user message; see :func:`~.prompts.to_prompt_result`). Raises
        TypeError for a bad signature, ValueError for a duplicate name."""

        def register(fn: F) -> F:
            self._catalog.add_prompt(
                prompt_from_function(fn, name=name, description=description, title=title, meta=meta)
            )
            return fn

        return register

    def add_prompt(
        self,
        name: str,
        handler: PromptHandler,
        *,
        description: str | None = None,
        arguments: Iterable[PromptArgument] = (),
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Register a prompt: ``handler(ctx, args)`` gets the string
        arguments, checked against ``arguments`` (unknown or missing
        required ones are refused with -32602 first). Raises ValueError for
        a duplicate or empty name."""
        self._catalog.add_prompt(
            PromptSpec(
                name=name,
                handler=handler,
                description=description,
                arguments=list(arguments),
                title=title,
                meta=dict(meta or {}),
            )
        )

    def completion(
        self, *, argument: str, prompt: str | None = None, resource_template: str | None = None
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, value: str,
        context: dict[str, str]) -> list[str]`` to complete ``argument`` of
        ``prompt`` (a prompt name) or of ``resource_template`` (a URI
        template, ``ref/resource``); see :meth:`add_completion`."""

        def register(fn: F) -> F:
            self.add_completion(fn, argument=argument, prompt=prompt, resource_template=resource_template)
            return fn

        return register

    def add_completion(
        self,
        handler: Completer,
        *,
        argument: str,
        prompt: str | None = None,
        resource_template: str | None = None,
    ) -> None:
        """Register a completer for ``argument`` of exactly one of
        ``prompt`` or ``resource_template``. It returns suggestions for the
        partial ``value``: a list of strings (the first 100 are sent, with
        ``total`` and ``hasMore``) or a ``Completion``. An argument without
        a completer completes to nothing; an unknown prompt or template is
        refused with -32602. Raises ValueError for a duplicate or when not
        exactly one of ``prompt``/``resource_template`` is given."""
        if (prompt is None) == (resource_template is None):
            raise ValueError("add_completion: give exactly one of prompt= or resource_template=")
        if prompt is not None:
            spec = CompletionSpec(kind="prompt", ref=prompt, argument=argument, handler=handler)
        else:
            assert resource_template is not None
            spec = CompletionSpec(kind="resource", ref=resource_template, argument=argument, handler=handler)
        self._catalog.add_completion(spec)

    def resources(self) -> list[ResourceSpec]:
        return self._catalog.resources()

    def resource_templates(self) -> list[ResourceTemplateSpec]:
        return self._catalog.templates()

    def prompts(self) -> list[PromptSpec]:
        return self._catalog.prompts()

    async def notify_resource_updated(self, uri: str) -> int:
        """Tell every open session subscribed to ``uri`` (exact match) that
        it changed (``notifications/resources/updated``, one PM each).
        Returns the number of sessions notified; failures are logged."""
        return await self._catalog.notify_resource_updated(uri)

    async def notify_resource_list_changed(self) -> int:
        """Send ``notifications/resources/list_changed`` to every open
        session that has used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("resources")

    async def notify_tool_list_changed(self) -> int:
        """Send ``notifications/tools/list_changed`` to every open session
        that listed tools (needs ``tools_list_changed`` in the config) or
        used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("tools")

    def track_session(self, ctx: ServerRequestContext[Any]) -> SessionState | None:
        """Remember the session of a request for later notifications (what
        the built-in catalog handlers do); returns its per-connection state
        (``state.uris`` holds its resource subscriptions), or None when the
        connection has none."""
        return self._catalog.remember(ctx)

    async def notify_prompt_list_changed(self) -> int:
        """Send ``notifications/prompts/list_changed`` to every open session
        that has used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("prompts")
