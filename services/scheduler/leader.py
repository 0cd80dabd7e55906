"""Leader election between scheduler replicas: a lease in a JetStream KV bucket.

The lease is one key holding `{holder, term, expires_at}`, written only by compare-and-set
(`create` when absent, `update` with the revision last read). The leader renews it every
`renew_s`, pushing `expires_at` to `now + lease_s`; a standby polls it at the same pace and,
once `expires_at + skew_s` has passed, takes it with the next term. Each term is fenced: the
scheduler stamps it on every plan, the placer refuses plans of an older term than it has
seen, and node agents drop such commands. A leader also fences itself: it stops publishing
at `written_at + lease_s - skew_s`, where `written_at` is when it *sent* its last successful
renewal, which is before the standby may take over (`expires_at + skew_s`), however long a
pause (GC, SIGSTOP, a partition) keeps it from learning that it lost.

`Elector` is the whole decision logic, a pure state machine: the observed lease and the time
in, the KV write to attempt out. `LeaseStore` does the KV I/O, and `Replica` runs the loop:
observe, write, then become leader (rebuild the scheduler from the stream, go live) or step
down (stop publishing, drop the core).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal

import nats
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from schemas.events import Envelope
from services.runtime.effects import Effect
from services.runtime.logging import get_logger
from services.runtime.service import Shell

BUCKET = "loom-leases"
KEY = "scheduler"
log = get_logger("loom.leader")


class LeaseError(ValueError):
    """A lease value that does not decode."""


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    term: int
    expires_at: float  # Unix time

    def encode(self) -> bytes:
        return json.dumps({"holder": self.holder, "term": self.term,
                           "expires_at": self.expires_at}).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Lease:
        try:
            data = json.loads(raw or b"")
            lease = cls(str(data["holder"]), int(data["term"]), float(data["expires_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise LeaseError(f"lease {KEY!r} in bucket {BUCKET!r} is not "
                             f"{{holder, term, expires_at}}: {raw!r:.80}") from exc
        if lease.term < 0:
            raise LeaseError(f"lease {KEY!r} has a negative term {lease.term}")
        return lease


@dataclass(frozen=True, slots=True)
class Observed:
    """The lease as read, with its KV revision (`lease` None: unreadable, overwritable)."""

    lease: Lease | None
    revision: int


@dataclass(frozen=True, slots=True)
class Write:
    """Compare-and-set: `revision` None creates the key (it must be absent)."""

    lease: Lease
    revision: int | None


Outcome = int | Literal["conflict", "unreachable"]  # new revision, CAS lost, no answer


class Elector:
    """One replica's view of the election (pure: every call takes the time)."""

    def __init__(self, me: str, *, lease_s: float = 6.0, renew_s: float = 2.0,
                 skew_s: float = 0.5) -> None:
        if not me:
            raise ValueError("a replica needs a non-empty id")
        if skew_s < 0:
            raise ValueError(f"skew_s must not be negative, not {skew_s}")
        if not (renew_s > 0 and 2 * renew_s + skew_s < lease_s):
            # A leader must be able to miss one renewal without lapsing.
            raise ValueError(f"lease timing: need 0 < 2·renew_s + skew_s < lease_s "
                             f"(renew_s={renew_s}, skew_s={skew_s}, lease_s={lease_s})")
        self.me, self.lease_s, self.renew_s, self.skew_s = me, lease_s, renew_s, skew_s
        self.term = 0  # the term this replica leads (or last led)
        self.seen_term = 0  # the newest term observed
        self.revision: int | None = None  # of our own lease, while we hold it
        self.valid_until = float("-inf")  # we may act as leader until then

    def is_leader(self, now: float) -> bool:
        return now < self.valid_until

    def observe(self, seen: Observed | None, now: float) -> Write | None:
        """What to write after reading the lease (None: nothing; keep waiting or leading)."""
        if seen is None:
            return Write(self._lease(self.seen_term + 1, now), None)
        lease = seen.lease
        if lease is None:  # garbage in the key: overwrite it, with a term above all we saw
            return Write(self._lease(self.seen_term + 1, now), seen.revision)
        self.seen_term = max(self.seen_term, lease.term)
        if lease.holder == self.me and seen.revision == self.revision:
            return Write(self._lease(lease.term, now), seen.revision)  # renew
        if lease.holder != self.me and self.revision is not None:
            self._step_down("another replica holds the lease")
        if lease.holder == self.me or now >= lease.expires_at + self.skew_s:
            # Lapsed, or ours from a previous life of this replica: a new term either way.
            return Write(self._lease(lease.term + 1, now), seen.revision)
        return None

    def written(self, write: Write, outcome: Outcome, sent_at: float) -> None:
        """The result of a write sent at `sent_at`."""
        if outcome == "conflict":
            self._step_down("lost the compare-and-set")
        elif outcome != "unreachable":
            self.term = self.seen_term = write.lease.term
            self.revision = outcome
            self.valid_until = sent_at + self.lease_s - self.skew_s
        # unreachable: no news; our own deadline (valid_until) still holds

    def _lease(self, term: int, now: float) -> Lease:
        return Lease(self.me, term, now + self.lease_s)

    def _step_down(self, why: str) -> None:
        if self.revision is not None:
            log.warning("stepping down", replica=self.me, term=self.term, reason=why)
        self.revision = None
        self.valid_until = float("-inf")


class LeaseStore:
    """The lease key in a JetStream KV bucket (file storage: it survives a server restart)."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: Any, bucket: str = BUCKET, replicas: int = 1) -> LeaseStore:
        try:
            kv = await js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            kv = await js.create_key_value(KeyValueConfig(
                bucket=bucket, history=1, storage=StorageType.FILE, replicas=replicas))
        return cls(kv)

    async def read(self) -> Observed | None:
        try:
            entry = await self.kv.get(KEY)
        except KeyNotFoundError:  # also a deleted or purged key
            return None
        if entry.value is None:
            return None
        try:
            return Observed(Lease.decode(entry.value), entry.revision)
        except LeaseError as exc:
            log.error("unreadable lease; it will be overwritten", reason=str(exc))
            return Observed(None, entry.revision)

    async def write(self, w: Write) -> Outcome:
        try:
            if w.revision is None:
                return int(await self.kv.create(KEY, w.lease.encode()))
            return int(await self.kv.update(KEY, w.lease.encode(), last=w.revision))
        except KeyWrongLastSequenceError:
            return "conflict"
        except nats.js.errors.APIError as exc:
            if "wrong last sequence" in str(exc).lower():
                return "conflict"
            log.warning("lease write failed", reason=f"{type(exc).__name__}: {exc}")
            return "unreachable"
        except Exception as exc:  # disconnected, timed out: the lease may still be ours
            log.warning("lease write failed", reason=f"{type(exc).__name__}: {exc}")
            return "unreachable"


class NotLeader(RuntimeError):
    """A replica that is no longer sure it leads must not publish."""


class FencedShell(Shell):
    """A scheduler shell that acts only while its replica holds the lease.

    Inputs and timers are refused without one; so are publishes, for a lease that lapsed
    while the core was deciding. Once anything was refused, the core's state may differ
    from what the stream says, so the shell is marked `refused` and the replica rebuilds.
    """

    def __init__(self, *args: Any, leading: Callable[[], bool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._leading = leading
        self.refused = False

    def _check(self) -> None:
        if not self._leading():
            self.refused = True
            raise NotLeader("the lease lapsed: not acting")  # an input stays unacked

    async def _on_message(self, env: Envelope) -> None:
        self._check()
        await super()._on_message(env)

    async def _fire(self, key: Hashable) -> None:
        if not self._leading():
            self.refused = True  # the timer is lost with this core: a rebuild re-arms it
            return
        await super()._fire(key)

    async def apply(self, effects: list[Effect], cause: str | None) -> None:
        if effects:
            self._check()
        await super().apply(effects, cause)

    def stop_timers(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()


@dataclass
class Term:
    """What a replica runs while it leads."""

    shell: FencedShell
    close: Callable[[], Awaitable[None]]


class Replica:
    """Election loop of one scheduler replica. `lead(term, leading)` rebuilds a scheduler and
    starts it (returning its shell and how to close it); it runs again on every new term."""

    def __init__(self, elector: Elector, store: LeaseStore,
                 lead: Callable[[int, Callable[[], bool]], Awaitable[Term]],
                 now: Callable[[], float] = time.time) -> None:
        self.elector, self.store, self.lead, self.now = elector, store, lead, now
        self.current: Term | None = None
        self.terms: list[int] = []  # every term this replica has led
        self._starting: asyncio.Task[None] | None = None

    def leading(self) -> bool:
        return self.elector.is_leader(self.now())

    async def step(self) -> None:
        """One round: read, maybe write, then start or stop leading. Starting (a rebuild
        from the stream) runs in its own task, so renewals go on while it takes."""
        try:
            seen = await self.store.read()
        except Exception as exc:  # the server is away: only our own deadline counts
            log.warning("lease read failed", reason=f"{type(exc).__name__}: {exc}")
        else:
            write = self.elector.observe(seen, self.now())
            if write is not None:
                sent_at = self.now()
                self.elector.written(write, await self.store.write(write), sent_at)
        if self._starting is not None:
            return  # decide once the start is over (its shell publishes nothing meanwhile)
        leader = self.leading()
        if self.current is not None and (not leader or self.terms[-1] != self.elector.term
                                         or self.current.shell.refused):
            # Lost it, re-elected under a new term, or the core acted on something it could
            # not publish: rebuild anew.
            await self._stop()
        if leader and self.current is None:
            term = self.elector.term
            log.warning("leading", replica=self.elector.me, term=term)
            self.terms.append(term)
            self._starting = asyncio.create_task(self._start(term))

    async def _start(self, term: int) -> None:
        try:
            self.current = await self.lead(term, self.leading)
        except Exception:  # e.g. the lease lapsed during the rebuild: try again next round
            log.exception("could not start leading", replica=self.elector.me, term=term)
        finally:
            self._starting = None

    async def _stop(self) -> None:
        assert self.current is not None
        log.warning("standing by", replica=self.elector.me, term=self.elector.term)
        current, self.current = self.current, None
        current.shell.stop_timers()
        with contextlib.suppress(Exception):
            await current.close()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.elector.renew_s)
        if self._starting is not None:
            await self._starting
        if self.current is not None:
            await self._stop()
