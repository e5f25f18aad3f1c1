"""Tests of brmcp.protocol: the shared _meta keys and payment shapes."""
