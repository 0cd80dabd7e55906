"""Policy engine: job table, lifecycle state machine, admission and scheduling cycles."""
