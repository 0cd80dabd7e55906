"""Node faults, as the scheduler core sees them: lost nodes and failed trainers.

Both live in the scheduler core (pure: time is an input, deadlines are the core's timers), so
a replay of the event log reproduces every requeue and every retry decision.

Liveness: a node is watched only once it has sent a heartbeat, so simulations (no heartbeats)
never arm a deadline and their decisions stay bit-identical. Each heartbeat moves the node's
deadline to `misses` of its announced intervals ahead; when the deadline fires the node is
lost: its GPUs leave the free pool (cordoned) and its jobs are requeued from the progress a
node last reported. A heartbeat from a lost node brings it back.

Cordons: a node takes no new work while anyone has a reason for it, each kept apart: an
operator's (`loom drain`) and its health checks' (`services.scheduler.health`), so that the
node's health passing again does not undo an operator's drain, nor an undrain a failing
check; the core's `drained` is the set of nodes with any reason. GPUs out of service (a
failed check about one GPU) are kept per node, with their reasons.

Retries: a trainer that exits non-zero on its own (not stopped by Loom) costs its job one
attempt; the job waits out an exponential backoff, out of the policy's sight, then queues
again; after `max_attempts` failures it fails for good, with the last reason. A failure a
trace records (a simulation replaying it, `JobSpec.fail_at`) takes the same path, except that
it is retried whatever the count, or fails the job for good at the trace's final failure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


def lost_key(node_id: str) -> tuple[str, str]:
    """The timer that fires when `node_id` has missed its heartbeats."""
    return ("node-lost", node_id)


def retry_key(job_id: str) -> tuple[str, str]:
    """The timer that ends `job_id`'s backoff."""
    return ("retry", job_id)


def launch_key(job_id: str, launched_by: tuple[int, int]) -> tuple[str, str, tuple[int, int]]:
    """The timer by which the run of `job_id` launched by plan (term, cycle) must have started."""
    return ("launch", job_id, launched_by)


OPERATOR, HEALTH = "operator", "health"  # who cordons a node


@dataclass(frozen=True)
class LivenessConfig:
    misses: int = 3  # heartbeats a node may miss before it is lost
    default_interval_s: float = 5.0  # for heartbeats that do not announce their interval
    # A launched run its node has not shown started by then is failed (0: never). Generous:
    # a trainer's start is a heartbeat away, but pulling a command's image may take long.
    launch_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.misses < 1:
            raise ValueError(f"liveness misses must be >= 1, not {self.misses}")
        if not self.launch_timeout_s >= 0:
            raise ValueError(f"launch timeout must be >= 0 s, not {self.launch_timeout_s}")
        if not self.default_interval_s > 0:
            raise ValueError("liveness default_interval_s must be positive")

    def timeout(self, interval_s: float) -> float:
        return self.misses * (interval_s if interval_s > 0 else self.default_interval_s)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for failed trainers: base·factor^(n-1), at most `cap_s`.

    `jitter` spreads each delay by up to ±jitter of itself, drawn from a hash of (seed, job,
    attempt): different jobs retry at different times, yet a replay draws the same delays.
    """

    max_attempts: int = 3  # failures a job may have; the last one fails it
    base_s: float = 10.0
    factor: float = 2.0
    cap_s: float = 300.0
    jitter: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"retry max_attempts must be >= 1, not {self.max_attempts}")
        if not (self.base_s >= 0 and self.factor >= 1 and self.cap_s >= self.base_s):
            raise ValueError("retry needs base_s >= 0, factor >= 1 and cap_s >= base_s "
                             f"(got {self.base_s}, {self.factor}, {self.cap_s})")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"retry jitter must be in [0, 1), not {self.jitter}")

    def delay(self, job_id: str, attempt: int) -> float:
        """Seconds to wait before running `job_id` again after its `attempt`-th failure."""
        delay = min(self.cap_s, self.base_s * self.factor ** (attempt - 1))
        if self.jitter:
            digest = hashlib.sha256(f"{self.seed}:{job_id}:{attempt}".encode()).digest()
            unit = int.from_bytes(digest[:8], "big") / 2**64  # [0, 1)
            delay *= 1 + self.jitter * (2 * unit - 1)
        return delay


@dataclass
class NodeFaults:
    """What the scheduler knows of node and trainer faults (state only; the core acts)."""

    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    watched: set[str] = field(default_factory=set)  # nodes that have sent a heartbeat
    lost: set[str] = field(default_factory=set)
    failures: dict[str, int] = field(default_factory=dict)  # job → trainer failures so far
    backoff: dict[str, float] = field(default_factory=dict)  # job → when it may run again
    cordons: dict[str, dict[str, str]] = field(default_factory=dict)  # node → {who: why}
    gpus_out: dict[str, dict[int, str]] = field(default_factory=dict)  # node → {GPU: why}
    warnings: dict[str, str] = field(default_factory=dict)  # node → its checks' warnings

    def cordon(self, drained: set[str], node: str, by: str, why: str) -> bool:
        """Cordon `node` for `by`'s reason (kept up to date); whether it took work until now."""
        self.cordons.setdefault(node, {})[by] = why
        fresh = node not in drained
        drained.add(node)
        return fresh

    def uncordon(self, drained: set[str], node: str, by: str) -> bool:
        """Lift `by`'s cordon; whether the node takes work again (no other reason left). An
        operator's undrain also lifts a drain recorded without a reason."""
        reasons = self.cordons.get(node, {})
        had = reasons.pop(by, None) is not None
        if not reasons:
            self.cordons.pop(node, None)
        if reasons or not (had or by == OPERATOR) or node not in drained:
            return False
        drained.discard(node)
        return True

    def cordoned_by(self, node: str, by: str) -> bool:
        return by in self.cordons.get(node, {})

    def beat(self, node_id: str, interval_s: float, now: float) -> tuple[float, bool]:
        """A heartbeat: the node's new deadline, and whether it was lost until now."""
        self.watched.add(node_id)
        returned = node_id in self.lost
        self.lost.discard(node_id)
        return now + self.liveness.timeout(interval_s), returned

    def fail(self, job_id: str, now: float, *, budgeted: bool = True) -> float | None:
        """A trainer failure: when the job may run again, or None if it is out of attempts.
        A failure the trace records (not `budgeted`) is retried whatever the count: the trace
        restarted the job, and its attempts are the truth."""
        n = self.failures[job_id] = self.failures.get(job_id, 0) + 1
        if budgeted and n >= self.retry.max_attempts:
            return None
        at = self.backoff[job_id] = now + self.retry.delay(job_id, n)
        return at
