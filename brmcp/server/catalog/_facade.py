"""The catalog methods of :class:`~brmcp.server.Harness`: registering and
listing free resources, resource templates, prompts and completions, and the
list-changed and resource-updated notifications, each delegated to the
harness's :class:`~._catalog.Catalog` (brmcp/server/catalog/_catalog.py).
Apart so the harness module keeps admission, lifecycle and calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, Unpack

from mcp.server import ServerRequestContext
from mcp.types import PromptArgument

from ._catalog import Catalog, SessionState
from ._completions import Completer, CompletionFields
from ._prompts import PromptFields, PromptHandler, PromptSpec
from ._resources import (
    ResourceFields,
    ResourceHandler,
    ResourceSpec,
    ResourceTemplateFields,
    ResourceTemplateSpec,
    TemplateHandler,
)

__all__ = ["CatalogMethods"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class CatalogMethods:
    """Mixed into :class:`~brmcp.server.Harness`, which sets ``_catalog``."""

    _catalog: Catalog

    def resource(
        self, uri: str, *, name: str | None = None, **fields: Unpack[ResourceFields]
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext)`` as the
        resource at ``uri``; its value becomes the read result. ``fields``
        are :class:`~.resources.ResourceFields`. Raises TypeError for a bad
        signature or keyword, ValueError for a duplicate or invalid uri
        (:meth:`.catalog.Catalog.resource`)."""
        return self._catalog.resource(uri, name=name, **fields)

    def add_resource(
        self, uri: str, handler: ResourceHandler, *, name: str, **fields: Unpack[ResourceFields]
    ) -> None:
        """Register the resource at ``uri`` served by ``handler(ctx)``.
        Raises ValueError for a duplicate or invalid uri or an empty name
        (:meth:`.catalog.Catalog.add_resource`)."""
        self._catalog.add_resource(uri, handler, name=name, **fields)

    def resource_template(
        self, uri_template: str, *, name: str | None = None, **fields: Unpack[ResourceTemplateFields]
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, **variables)``
        for the URIs matching the RFC 6570 ``uri_template``; ``fields`` are
        :class:`~.resources.ResourceTemplateFields`. Raises TypeError for a
        bad signature or keyword, ValueError for a duplicate or invalid
        template (:meth:`.catalog.Catalog.resource_template`)."""
        return self._catalog.resource_template(uri_template, name=name, **fields)

    def add_resource_template(
        self,
        uri_template: str,
        handler: TemplateHandler,
        *,
        name: str,
        **fields: Unpack[ResourceTemplateFields],
    ) -> None:
        """Register a resource template served by ``handler(ctx, variables)``.
        Raises ValueError for a duplicate or invalid template or an empty
        name (:meth:`.catalog.Catalog.add_resource_template`)."""
        self._catalog.add_resource_template(uri_template, handler, name=name, **fields)

    def prompt(self, name: str | None = None, **fields: Unpack[PromptFields]) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, arg: str, ...)``
        as a prompt whose arguments are the str parameters after ``ctx``;
        ``fields`` are :class:`~.prompts.PromptFields`. Raises TypeError for
        a bad signature or keyword, ValueError for a duplicate name
        (:meth:`.catalog.Catalog.prompt`)."""
        return self._catalog.prompt(name, **fields)

    def add_prompt(
        self,
        name: str,
        handler: PromptHandler,
        *,
        arguments: Iterable[PromptArgument] = (),
        **fields: Unpack[PromptFields],
    ) -> None:
        """Register a prompt served by ``handler(ctx, args)``, its string
        arguments checked against ``arguments`` first. Raises ValueError for
        a duplicate or empty name (:meth:`.catalog.Catalog.add_prompt`)."""
        self._catalog.add_prompt(name, handler, arguments=arguments, **fields)

    def completion(self, **fields: Unpack[CompletionFields]) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx, value, context) -> list[str]``
        to complete ``argument`` of one prompt or resource template
        (:class:`~.completions.CompletionFields`; :meth:`.catalog.Catalog.completion`)."""
        return self._catalog.completion(**fields)

    def add_completion(self, handler: Completer, **fields: Unpack[CompletionFields]) -> None:
        """Register a completer for ``argument`` of exactly one of ``prompt``
        or ``resource_template``. Raises ValueError for a duplicate or when
        not exactly one is given (:meth:`.catalog.Catalog.add_completion`)."""
        self._catalog.add_completion(handler, **fields)

    def resources(self) -> list[ResourceSpec]:
        """The registered resources, in registration order."""
        return self._catalog.resources()

    def resource_templates(self) -> list[ResourceTemplateSpec]:
        """The registered resource templates, in registration order."""
        return self._catalog.templates()

    def prompts(self) -> list[PromptSpec]:
        """The registered prompts, in registration order."""
        return self._catalog.prompts()

    async def notify_resource_updated(self, uri: str, *, peer: str | None = None) -> int:
        """Tell every open session subscribed to ``uri`` (exact match; only
        ``peer``'s sessions when given) that it changed
        (``notifications/resources/updated``, one PM each). Returns the
        number of sessions notified; failures are logged."""
        return await self._catalog.notify_resource_updated(uri, peer=peer)

    def resource_subscribers(self, uri: str, *, peer: str | None = None) -> int:
        """How many open sessions (of ``peer`` when given) subscribed to ``uri``."""
        return self._catalog.subscribers(uri, peer=peer)

    async def notify_resource_list_changed(self) -> int:
        """Send ``notifications/resources/list_changed`` to every open
        session that has used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("resources")

    async def notify_tool_list_changed(self) -> int:
        """Send ``notifications/tools/list_changed`` to every open session
        that listed tools (needs ``tools_list_changed`` in the config) or
        used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("tools")

    async def notify_prompt_list_changed(self) -> int:
        """Send ``notifications/prompts/list_changed`` to every open session
        that has used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("prompts")

    def track_session(self, ctx: ServerRequestContext[Any]) -> SessionState | None:
        """Remember the session of a request for later notifications (what
        the built-in catalog handlers do); returns its per-connection state
        (``state.uris`` holds its resource subscriptions), or None when the
        connection has none."""
        return self._catalog.remember(ctx)
