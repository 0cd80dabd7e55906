"""The command gate: duplicates, stale stops and deposed terms dropped; a job that finished
here never starts again, and is then forgotten but for that."""

from __future__ import annotations

import pytest

from schemas.events import STOP_GANG_FINISHED, Launch, NodeCommand, Stop
from services.nodeagent.gate import CommandGate
from tests.builders import make_job


def _launch(job_id: str) -> Launch:
    return Launch(job_id=job_id, spec=make_job(job_id).build(), placement=(("n0", (0,)),))


def _cmd(cycle: int, launches: tuple[str, ...] = (), stops: tuple[tuple[str, str], ...] = (),
         term: int = 0) -> NodeCommand:
    return NodeCommand(node_id="n0", cycle=cycle, term=term,
                       launches=tuple(_launch(j) for j in launches),
                       stops=tuple(Stop(job_id=j, reason=r) for j, r in stops))


def _admitted(gate: CommandGate, cmd: NodeCommand) -> tuple[list[str], list[str]]:
    out = gate.admit(cmd)
    if out is None:
        return [], []
    return [x.job_id for x in out.launches], [s.job_id for s in out.stops]


@pytest.mark.parametrize(("ends", "relaunch"), [
    ("finish", _cmd(9, launches=("a",))),  # the leader reported it done
    ("gang", _cmd(9, launches=("a",))),  # the placer stopped the rest of a finished gang
])
def test_a_finished_job_is_never_launched_again_and_its_launch_is_forgotten(
        ends: str, relaunch: NodeCommand) -> None:
    gate = CommandGate()
    assert _admitted(gate, _cmd(1, launches=("a",))) == (["a"], [])
    if ends == "finish":
        gate.finish("a")
    else:
        assert _admitted(gate, _cmd(-1, stops=(("a", STOP_GANG_FINISHED),))) == ([], ["a"])
    assert "a" not in gate.launched  # a long run does not keep every job it ever ran
    assert _admitted(gate, relaunch) == ([], [])
    assert gate.dropped == 1


def test_duplicates_stale_stops_and_older_terms_are_dropped() -> None:
    gate = CommandGate()
    assert _admitted(gate, _cmd(2, launches=("a",), term=1)) == (["a"], [])
    assert _admitted(gate, _cmd(2, launches=("a",), term=1)) == ([], [])  # re-delivered
    assert _admitted(gate, _cmd(1, stops=(("a", "preempted"),), term=1)) == ([], [])  # stale
    assert _admitted(gate, _cmd(3, launches=("b",), term=0)) == ([], [])  # deposed leader
    assert _admitted(gate, _cmd(3, stops=(("a", "preempted"),), term=1)) == ([], ["a"])
