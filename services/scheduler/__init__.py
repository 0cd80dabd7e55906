"""Policy engine: job table, lifecycle state machine, admission and scheduling cycles."""

from domain.compiled import extend

extend(__path__, __name__)
