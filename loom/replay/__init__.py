"""Replay of event logs (`loom replay`, `loom log export`); see docs/replay.md."""
