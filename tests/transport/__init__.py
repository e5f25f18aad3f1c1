"""Tests of brmcp.transport: sessions over PMs, inbox bounds, faults."""
