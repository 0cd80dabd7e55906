"""Why the placer refuses a plan (raised by its core; the shell dead-letters the plan or, for
the two that may resolve themselves, hands it back to be retried). Kept outside the core's
module, which is compiled (domain/compiled.py): mypyc compiles no exception class with two
bases."""

from __future__ import annotations

from services.runtime.service import RetryLater


class DoubleBooking(RuntimeError):
    pass


class HeldByAnother(DoubleBooking, RetryLater):
    """A launch onto a GPU the placer still sees held: on a live cluster the holder's finish
    may just not have reached the placer yet (its own consumer), so the plan is retried."""


class StillBound(DoubleBooking, RetryLater):
    """A relaunch of a job the placer still sees bound: the report that ended its run (a
    failure, then a retry after backoff) may not have reached the placer yet; retried too."""


class StaleTerm(RuntimeError):
    """A plan of a deposed scheduler leader (an older election term than one already seen)."""
