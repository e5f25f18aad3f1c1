"""Tests of brmcp.gateway: selling an MCP server that already exists."""
