"""Loom's services: each a deterministic core (no I/O) wrapped in a thin asyncio shell."""
