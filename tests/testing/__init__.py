"""Tests of brmcp.testing: fabric, fakebr, brnet, goref, pipe."""
