"""Tests of brmcp.wire, the sans-I/O codec."""
