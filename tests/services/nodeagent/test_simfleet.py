"""A fleet of simulated nodes (services/nodeagent/simfleet.py) takes each cycle once for all its
nodes and decides exactly as one service per node did."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.overhead import OverheadModel, parse_overhead
from loom import simulate as simulate_module
from schemas import subjects
from schemas.cluster import ClusterSpec, NodeSpec
from schemas.events import CycleStarted, JobFinished, Launch, NodeCommand
from schemas.job import JobSpec
from schemas.throughputs import ThroughputTable
from services.nodeagent import simfleet
from services.nodeagent.simfleet import SimFleetCore, SimNodeCore, _Counts
from services.runtime.bus import Interest, MemoryBus
from services.runtime.clock import VirtualClock
from services.runtime.effects import Effect, Publish, ReserveOrder, SetTimer
from services.runtime.kernel import SimKernel
from services.runtime.service import Core, Shell
from tests.builders import cluster, deliver, make_job, simulate
from tests.services.nodeagent import sim_traces

NODES = [NodeSpec(node_id=f"n{i}", switch_id="s0", gpus=4) for i in range(3)]


def _fleet() -> SimFleetCore:
    return SimFleetCore(NODES, parse_overhead("muri"))


def _launch(core: Core, node: str, *jobs: str, now: float = 0.0, cycle: int = 1) -> None:
    launches = tuple(
        Launch(job_id=j, spec=make_job(j).model("a2c").gpus(1).runs_for(1000).build(),
               placement=((node, (k,)),)) for k, j in enumerate(jobs))
    deliver(core, NodeCommand(node_id=node, cycle=cycle, launches=launches), now)


def _early(core: SimFleetCore, node: str, job: str, now: float) -> SetTimer:
    """The finish timer of `job` on `node` come up before the cycles' charges: set again."""
    (timer,) = core.on_timer(("finish", node, job), now)
    assert isinstance(timer, SetTimer)
    return timer


# -- the block of places a cycle reserves ---------------------------------------------------

def test_a_cycle_reserves_one_place_per_charged_run_and_each_node_takes_its_own_in_order(
        ) -> None:
    fleet = _fleet()
    _launch(fleet, "n0", "a", "b")
    _launch(fleet, "n2", "c")
    assert deliver(fleet, CycleStarted(cycle=2, trigger="t"), 10.0) == [ReserveOrder(3)]
    # n0's runs take places 0 and 1, n2's run the next one.
    assert [_early(fleet, n, j, 11.0).order for n, j in [("n2", "c"), ("n0", "b")]] == [2, 1]


def test_runs_launched_between_cycles_take_places_from_the_next_cycle_on() -> None:
    fleet = _fleet()
    _launch(fleet, "n0", "a")
    _launch(fleet, "n2", "c")
    deliver(fleet, CycleStarted(cycle=2, trigger="t"), 10.0)
    _launch(fleet, "n1", "b", now=11.0, cycle=3)  # after the cycle: not in its block
    assert _early(fleet, "n2", "c", 12.0).order == 1
    assert deliver(fleet, CycleStarted(cycle=4, trigger="t"), 20.0) == [ReserveOrder(3)]
    assert _early(fleet, "n2", "c", 21.0).order == 2


def test_a_fleet_with_no_charged_run_passes_a_cycle_over() -> None:
    fleet = _fleet()
    (sub,) = [s for s in fleet.subscriptions() if s.subject == subjects.CYCLE_STARTED]
    wants = sub.wants
    assert isinstance(wants, Interest)
    cycle = CycleStarted(cycle=1, trigger="t")
    assert not wants.on and deliver(fleet, cycle, 1.0) == []
    _launch(fleet, "n1", "a")
    assert wants.on and deliver(fleet, cycle, 2.0) == [ReserveOrder(1)]
    fleet.on_timer(("finish", "n1", "a"), 2.0)  # early: set again
    fleet.on_timer(("finish", "n1", "a"), 3000.0)  # finished: nothing left to charge
    assert not wants.on


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(-5, 5)), max_size=40))
def test_counts_sum_the_nodes_before_one(adds: list[tuple[int, int]]) -> None:
    counts, plain = _Counts(16), [0] * 16
    for i, delta in adds:
        counts.add(i, delta)
        plain[i] += delta
    assert counts.total == sum(plain)
    assert [counts.before(i) for i in range(17)] == [sum(plain[:i]) for i in range(17)]


# -- messages ----------------------------------------------------------------------------------

def test_a_command_for_a_node_the_fleet_does_not_run_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'n9'.*does not run"):
        _launch(_fleet(), "n9", "a")


def test_each_node_publishes_on_its_own_subject_under_its_own_name() -> None:
    fleet = SimFleetCore(NODES, parse_overhead("none"))
    _launch(fleet, "n1", "a")
    (ended,) = fleet.on_timer(("finish", "n1", "a"), 1000.0)
    assert isinstance(ended, Publish) and isinstance(ended.body, JobFinished)
    assert (ended.subject, ended.producer) == ("loom.node.n1.finished", "nodeagent-n1")


def test_the_shell_numbers_each_producers_events_apart() -> None:
    """A fleet's nodes keep the event ids and producer names of a service per node; the
    shell's own name shares its numbering with the core's other publishes."""

    async def run() -> list[tuple[str, str]]:
        kernel = SimKernel()
        bus = MemoryBus(kernel)
        seen: list[tuple[str, str]] = []

        async def record(env):  # type: ignore[no-untyped-def]
            seen.append((env.event_id, env.producer))

        await bus.subscribe(">", record, durable="t")
        shell = Shell(SimNodeCore(NODES[0], parse_overhead("none")), bus, VirtualClock(kernel),
                      run_id="r")
        body = CycleStarted(cycle=1, trigger="t")
        effects: list[Effect] = [Publish("a", body, producer="nodeagent-n7"), Publish("b", body),
                                 Publish("c", body, producer="nodeagent-n7"),
                                 Publish("d", body, producer="nodeagent-n0")]
        await shell.apply(effects, None)
        await kernel.run()
        return seen

    assert asyncio.run(run()) == [("r.nodeagent-n7.1", "nodeagent-n7"),
                                  ("r.nodeagent-n0.1", "nodeagent-n0"),
                                  ("r.nodeagent-n7.2", "nodeagent-n7"),
                                  ("r.nodeagent-n0.2", "nodeagent-n0")]


# -- against one service per node ------------------------------------------------------------

def _node_per_service(cl: ClusterSpec, overhead: OverheadModel,
                      profile: ThroughputTable | None) -> Sequence[Core]:
    return [SimNodeCore(node, overhead, profile) for node in cl.nodes]


def _run(jobs: list[JobSpec], policy: str, nodes: int, overhead: str) -> tuple[object, ...]:
    out = simulate(jobs, policy, cluster(nodes, 8, switches=nodes // 2 or 1), overhead=overhead)
    s = out.summary
    return s["decision_digest"], s["events"], s["cycles"], s["avg_jct_s"], s["errors"]


@settings(max_examples=50, deadline=None)
@given(rows=sim_traces.rows((1, 1, 2, 4, 8, 16)),
       policy=st.sampled_from(["srtf", "tiresias", "muri-s", "fifo"]),
       nodes=st.sampled_from([2, 3, 4, 6]), overhead=st.sampled_from(["muri", "muri", "none"]),
       catch_up=st.sampled_from([2, 3, 64]))
def test_a_fleet_decides_as_one_service_per_node(rows: list[sim_traces.Row],
                                                  policy: str, nodes: int, overhead: str,
                                                  catch_up: int) -> None:
    """The same decisions, events and cycles, also where the fleet catches its runs up at
    other cycles than each node would alone."""
    jobs = sim_traces.jobs(rows)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(simfleet, "CATCH_UP_CYCLES", catch_up)
        fleet = _run(jobs, policy, nodes, overhead)
        m.setattr(simulate_module, "simulated_nodes", _node_per_service)
        apart = _run(jobs, policy, nodes, overhead)
    assert fleet == apart and fleet[-1] == 0
