"""Trace injector: replays a trace as job submissions at their (virtual or scaled) times."""
