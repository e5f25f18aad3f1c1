"""The documents checked against the code: citations, WIRE.md's examples."""
