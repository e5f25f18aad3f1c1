"""Tests of brmcp.server: the harness, its ledger, journal and tips, run_bot."""
