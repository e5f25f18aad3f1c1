"""Tests of brmcp.bridge: the payer's side, its policy, HTTP surface and daemon."""
