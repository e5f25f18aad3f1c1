"""Tests of brmcp.clientrpc, the brclient client."""
