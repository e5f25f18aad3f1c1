"""The shared test kit: uids, stacks (fabric, harness, bridge, fakebr), waits and paths."""
