"""The commands as users run them: demo, first hour, README flows, agents' tools."""
