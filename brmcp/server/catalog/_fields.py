"""The catalog's keyword fields at run time.

Each kind declares its fields once, as a ``TypedDict`` beside its spec
(:class:`~.tools.ToolFields`, :class:`~.resources.ResourceFields`,
:class:`~.resources.ResourceTemplateFields`, :class:`~.prompts.PromptFields`,
:class:`~.completions.CompletionFields`), and every registering function
takes them as ``**fields: Unpack[...]`` (PEP 692): a type checker sees the
same keyword parameters as before. Python does not check such keywords at
run time, so :func:`spec_fields` does: an unknown or missing keyword raises
:class:`TypeError` when the function is called, as it did when the
parameters were spelled out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["spec_fields"]


def spec_fields(fields: Mapping[str, Any], declared: type[Any], where: str) -> dict[str, Any]:
    """``fields`` checked against ``declared`` (one of the kinds' TypedDicts)
    and ready to pass to the kind's spec constructor, whose field names they
    are: ``meta`` is copied (None: an empty dict), everything else is passed
    as given; fields not given are left to the spec's defaults. Raises
    TypeError naming ``where`` (the public function, e.g. ``"tool"``) for an
    unknown key or a missing required one."""
    required: frozenset[str] = declared.__required_keys__
    known: frozenset[str] = required | declared.__optional_keys__
    for key in fields:
        if key not in known:
            raise TypeError(f"{where}() got an unexpected keyword argument {key!r}")
    missing = sorted(required - fields.keys())
    if missing:
        raise TypeError(f"{where}() missing required keyword argument {missing[0]!r}")
    out = dict(fields)
    if "meta" in out:
        out["meta"] = dict(out["meta"] or {})
    return out
