"""Paid calls end to end: an agent, the bridge, the relay and a harness, with faults."""
