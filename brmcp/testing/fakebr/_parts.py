"""Attributes of :class:`~brmcp.testing.fakebr.FakeBRClient` kept in its parts:
the client is split by concept into parts (settings, record, events), and
tests read and set these knobs on the client itself, so each one is a
descriptor forwarding to the part that owns it."""

from __future__ import annotations

from typing import Generic, TypeVar, overload

__all__ = ["In"]

T = TypeVar("T")


class In(Generic[T]):
    """A :class:`FakeBRClient` attribute kept in one of its parts (the part
    named ``part``, under the attribute's own name): reading and assigning it
    on the client reads and assigns it there, so every part sees a change."""

    def __init__(self, part: str) -> None:
        self._part = part
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type) -> In[T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> T: ...
    def __get__(self, obj: object | None, owner: type) -> T | In[T]:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self._part), self._name)
        return value

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self._part), self._name, value)
