"""The official MCP conformance suite (server mode) against the bridge.

A Python :class:`~brmcp.server.Harness` serves the suite's fixture tools
(``fixture.py``) over the in-memory fabric; the bridge mirrors it at
``/mcp/<bot uid>``; a loopback proxy (``proxy.py``) adds the bearer header the
suite cannot send; ``suite.py`` runs the pinned Node suite and compares its
verdicts with ``baseline.yml``. Run it standalone with
``python -m tests.conformance.run``.
"""
