"""Tests of brmcp.metrics."""
