"""The node agent's health checks over its life, and the report each heartbeat carries.

All of the doctor's checks at start-up, the cheap ones (`ON_HEARTBEAT`) on every heartbeat
and the rest again every `REFRESH_S` in the background; each heartbeat sends the problems
(`to_health`), and the scheduler cordons the node, or takes single GPUs out of service,
while a check fails (`domain.health`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable

from schemas.events import HealthProblem, NodeHealth
from services.nodeagent.check_result import Check, Status
from services.nodeagent.doctor import ON_HEARTBEAT, REFRESH_S, SEVERITY, Doctor, worst
from services.runtime.logging import get_logger

log = get_logger("loom.doctor")


def to_health(checks: Iterable[Check]) -> NodeHealth:
    """The problems, for the heartbeat: what each measured, cut to fit the event."""
    return NodeHealth(problems=tuple(
        HealthProblem(check=c.name, status=c.status, detail=c.measured[:1024], gpu=c.gpu)
        for c in checks if c.status in ("warn", "fail")))


class HealthMonitor:
    """The node agent's checks: all of them at start-up, the cheap ones on every heartbeat,
    the others again every `refresh_s` (in the background); `beat` is the report a
    heartbeat carries. Changes are logged: a check that starts or stops failing."""

    def __init__(self, doctor: Doctor, refresh_s: float = REFRESH_S) -> None:
        self.doctor = doctor
        self.refresh_s = refresh_s
        self.slow: list[Check] = []  # the latest results of the checks not on heartbeats
        self.latest: list[Check] = []
        self._refreshed_at = time.monotonic()
        self._refreshing: asyncio.Task[None] | None = None
        self._seen: dict[tuple[str, int | None], Status] = {}

    async def startup(self) -> list[Check]:
        checks = await self.doctor.run()
        self.slow = [c for c in checks if c.name not in ON_HEARTBEAT]
        self._refreshed_at = time.monotonic()
        self._note(checks, startup=True)
        return checks

    def beat(self) -> NodeHealth:
        """This heartbeat's report: its own checks and the latest of the others."""
        if (self._refreshing is None and self.refresh_s > 0
                and time.monotonic() - self._refreshed_at >= self.refresh_s):
            self._refreshing = asyncio.ensure_future(self._refresh())
        try:
            checks = [*self.doctor.quick(), *self.slow]
        except Exception as exc:  # a check's bug must not stop the heartbeat
            checks = [Check("driver", "warn", f"the checks failed: {type(exc).__name__}: "
                                              f"{exc}"), *self.slow]
        self._note(checks)
        return to_health(checks)

    async def _refresh(self) -> None:
        try:
            self.slow = await self.doctor.slow(self.slow)
        except Exception as exc:
            log.warning("health checks failed", reason=f"{type(exc).__name__}: {exc}")
        finally:
            self._refreshed_at = time.monotonic()
            self._refreshing = None

    async def stop(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(BaseException):
                await self._refreshing

    def _note(self, checks: list[Check], startup: bool = False) -> None:
        self.latest = checks
        now = {(c.name, c.gpu): c.status for c in checks}
        for c in checks:
            before = self._seen.get((c.name, c.gpu), "pass")
            if c.status in ("warn", "fail") and (startup or before != c.status):
                getattr(log, "error" if c.status == "fail" else "warning")(
                    "health check " + ("failed" if c.status == "fail" else "warns"),
                    check=c.name, gpu=c.gpu, measured=c.measured, fix=c.fix)
            elif c.status == "pass" and before in ("warn", "fail"):
                log.info("health check passes again", check=c.name, gpu=c.gpu,
                         measured=c.measured)
        if startup:
            log.info("health checks at start-up", worst=worst(checks),
                     **{s: sum(c.status == s for c in checks) for s in SEVERITY})
        self._seen = now
