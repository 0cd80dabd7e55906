"""Idempotent, fenced node commands (see `CommandGate`)."""

from __future__ import annotations

from schemas.events import STOP_GANG_FINISHED, NodeCommand


class CommandGate:
    """Makes node commands idempotent and fenced, across re-deliveries and restarts.

    JetStream's `Nats-Msg-Id` window does not cover a consumer that restarts and gets its
    unacknowledged commands again, nor a placer that re-binds a plan under a new event id.
    So each launch is keyed by the plan that made it, (term, cycle): a launch no newer than
    the job's latest one here is a duplicate, a job that finished here never starts again,
    a stop older than the job's latest launch is stale (stops out of cycle, -1, always
    apply: the placer's of a finished gang, the scheduler's reconcile), and a command of an
    older term (a deposed scheduler's) is dropped whole. Pure: a restarted agent rebuilds it
    by feeding the commands it had handled back through `admit`.
    """

    def __init__(self) -> None:
        self.term = 0
        self.launched: dict[str, tuple[int, int]] = {}  # job → (term, cycle) of its last launch
        self.finished: set[str] = set()
        self.dropped = 0  # launches and stops ignored as duplicates or stale
        self.handled: tuple[int, int] | None = None  # the newest in-cycle command admitted

    def admit(self, cmd: NodeCommand) -> NodeCommand | None:
        """The part of `cmd` to carry out (None: nothing)."""
        if cmd.term < self.term:
            self.dropped += len(cmd.launches) + len(cmd.stops)
            return None
        self.term = cmd.term
        key = (cmd.term, cmd.cycle)
        if cmd.cycle < 0:  # out of cycle: always applies
            # The rest of a gang whose leader finished it is done here for good; a reconcile
            # stop (a heartbeat named a run the scheduler no longer places here) is not: the
            # job may well be launched here again.
            for s in cmd.stops:
                if s.reason == STOP_GANG_FINISHED:
                    self.finish(s.job_id)
            return cmd
        if self.handled is None or key > self.handled:
            self.handled = key
        stops = tuple(s for s in cmd.stops if self.launched.get(s.job_id, (-1, -1)) <= key)
        launches = tuple(x for x in cmd.launches if x.job_id not in self.finished
                         and self.launched.get(x.job_id, (-1, -1)) < key)
        for x in launches:
            self.launched[x.job_id] = key
        self.dropped += len(cmd.stops) - len(stops) + len(cmd.launches) - len(launches)
        if not stops and not launches:
            return None
        if len(stops) == len(cmd.stops) and len(launches) == len(cmd.launches):
            return cmd
        return cmd.model_copy(update={"stops": stops, "launches": launches})

    def finish(self, job_id: str) -> None:
        """`job_id` is done here for good: its launches are refused from now on, so its latest
        launch need not be remembered (a stop of it finds nothing to stop)."""
        self.finished.add(job_id)
        self.launched.pop(job_id, None)
