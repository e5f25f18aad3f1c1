"""The ``_meta`` keys of brmcp's era extensions, shared by both roles
(WIRE.md §Eras). Plain constants: the harness side is
:mod:`brmcp.server.firstcontact`, the bridge side :mod:`brmcp.bridge.links._link`."""

from __future__ import annotations

__all__ = ["CAPABILITIES_META_KEY", "LIST_TOOLS_KEY", "MODERN_VERSIONS_KEY", "TOOLS_KEY"]

#: Modern-era ``tools/list`` result ``_meta`` key: the capabilities the
#: server would declare in an ``initialize`` answer (spares ``server/discover``).
CAPABILITIES_META_KEY = "brmcp/capabilities"
#: First contact: ``initialize`` ``params._meta`` key; ``true`` asks for the two below.
LIST_TOOLS_KEY = "brmcp/listTools"
#: First contact: ``initialize`` result ``_meta`` key, the modern-era
#: versions the server also serves (a JSON array of strings).
MODERN_VERSIONS_KEY = "brmcp/modernVersions"
#: First contact: ``initialize`` result ``_meta`` key, what a handshake-era
#: ``tools/list`` would answer the caller (a JSON object ``{"tools": [...]}``).
TOOLS_KEY = "brmcp/tools"
