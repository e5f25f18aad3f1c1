"""Tests of brmcp.serve, the daemon behind brmcp-serve."""
