"""The same scenario gives the same decisions on the in-memory bus and on NATS JetStream."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from loom.simulate import SimConfig, SimResult, run_simulation
from schemas.job import JobState
from services.runtime.natsserver import EmbeddedNats
from tests.builders import cluster
from tests.integration.pipeline import generated_trace
from traces import load_cluster, load_trace
from traces.gavel_generator import generate_gavel_jobs, write_gavel_trace
from traces.scaling import load_scaling, with_scaling

POLICIES = ("fifo", "srtf", "tiresias")
SEED = 11


def _ends(result: SimResult) -> dict[str, float | None]:
    return {j.job_id: j.end_s for j in result.jobs}


def _check_complete(result: SimResult, n: int) -> None:
    s = result.summary
    assert s["jobs"] == n and s["finished"] == n, s
    assert s["errors"] == 0 and s["unfinished"] == 0, s
    assert all(j.state is JobState.FINISHED for j in result.jobs)


@pytest.fixture(scope="module")
def trace() -> list:  # type: ignore[type-arg]
    jobs = generated_trace(SEED, 32)
    assert len({j.gpus for j in jobs}) >= 3, "the trace must mix GPU counts"
    assert len({j.submit_time_s for j in jobs}) >= 10, "and spread arrivals"
    return jobs


@pytest.mark.parametrize("policy", POLICIES)
async def test_memory_and_nats_buses_make_identical_decisions(
    policy: str, trace: list, nats_server: EmbeddedNats  # type: ignore[type-arg]
) -> None:
    cl = cluster(2, 4)

    def cfg(bus: str, url: str | None = None) -> SimConfig:
        return SimConfig(policy=policy, jobs=trace, cluster=cl, trace_name="gen", bus=bus,  # type: ignore[arg-type]
                         nats_url=url)

    mem1 = await run_simulation(cfg("memory"))
    mem2 = await run_simulation(cfg("memory"))
    shared = await run_simulation(cfg("nats", nats_server.url))  # prefixed stream, shared server
    private = await run_simulation(cfg("nats"))  # its own embedded server, the `LOOM` stream

    for r in (mem1, mem2, shared, private):
        _check_complete(r, len(trace))
    # The scenario must exercise preemption for srtf/tiresias, or the comparison is weak.
    if policy != "fifo":
        assert int(mem1.summary["preemptions"]) > 0  # type: ignore[call-overload]

    digest = mem1.summary["decision_digest"]
    assert isinstance(digest, str) and len(digest) == 64
    assert mem2.summary["decision_digest"] == digest  # deterministic on one bus
    assert shared.summary["decision_digest"] == digest
    assert private.summary["decision_digest"] == digest

    assert _ends(shared) == _ends(mem1) == _ends(private) == _ends(mem2)
    assert shared.summary["events"] == mem1.summary["events"] == private.summary["events"]
    for key in ("avg_jct_s", "makespan_s", "preemptions", "cycles", "gpu_util"):
        assert shared.summary[key] == mem1.summary[key], key
    assert shared.summary["bus"] == "nats" and mem1.summary["bus"] == "memory"


async def test_different_policies_give_different_digests(trace: list) -> None:  # type: ignore[type-arg]
    # Guards the test above: the digest does depend on the decisions.
    cl = cluster(2, 4)
    digests = {
        (await run_simulation(SimConfig(policy=p, jobs=trace, cluster=cl))).summary[
            "decision_digest"]
        for p in POLICIES
    }
    assert len(digests) == len(POLICIES)


async def test_bundled_tiresias_trace_is_identical_on_both_buses(
    nats_server: EmbeddedNats,
) -> None:
    tr = load_trace("tiresias/60_job")
    cl = load_cluster("tiresias/cluster_spec")

    def cfg(bus: str, url: str | None = None) -> SimConfig:
        return SimConfig(policy="tiresias", jobs=tr.jobs, cluster=cl, trace_name=tr.name,
                         overhead=tr.default_overhead, bus=bus, nats_url=url)  # type: ignore[arg-type]

    mem = await run_simulation(cfg("memory"))
    net = await run_simulation(cfg("nats", nats_server.url))
    _check_complete(mem, 60)
    _check_complete(net, 60)
    assert net.summary["decision_digest"] == mem.summary["decision_digest"]
    assert net.summary["events"] == mem.summary["events"]
    assert _ends(net) == _ends(mem)
    assert {j.job_id for j in net.jobs} == {j.job_id for j in tr.jobs}


async def test_interleaved_groups_are_identical_on_both_buses() -> None:
    # Muri co-locates jobs on shared GPUs: launches name their partners, the placer lets one
    # group hold a GPU, nodes run members at the group's speed. All of it over the wire.
    jobs = [j.model_copy(update={"stage_times_s": (0.2 + 0.1 * (k % 3), 0.3 + 0.2 * (k % 2),
                                                   0.05 * (k % 4))})
            for k, j in enumerate(generated_trace(SEED, 24))]
    cl = cluster(2, 4)

    def cfg(bus: str) -> SimConfig:
        return SimConfig(policy="muri-s", jobs=jobs, cluster=cl, bus=bus,  # type: ignore[arg-type]
                         overhead="muri")

    mem, nats = await run_simulation(cfg("memory")), await run_simulation(cfg("nats"))
    _check_complete(mem, len(jobs))
    _check_complete(nats, len(jobs))
    assert int(mem.summary["interleaved_launches"]) > 0  # type: ignore[call-overload]
    assert mem.summary["decision_digest"] == nats.summary["decision_digest"]
    assert _ends(mem) == _ends(nats)
    assert float(mem.summary["gpu_util"]) <= 1.0  # type: ignore[arg-type]


@pytest.mark.parametrize(("policy", "kind"), [
    ("max-min-fairness-perf", "gavel"),   # per-GPU-type speeds, rounds
    ("max-min-fairness-packed", "gavel"),  # co-located pairs at profiled rates
    ("edf-accessctrl", "elastic"),         # GPU-count maps (int keys) and declined jobs
])
async def test_profiled_jobs_make_identical_decisions_over_nats(
    policy: str, kind: str, nats_server: EmbeddedNats
) -> None:
    if kind == "gavel":
        with tempfile.TemporaryDirectory() as tmp:
            path = write_gavel_trace(generate_gavel_jobs(24, lam=300.0, seed=3, multi_gpu=True),
                                     Path(tmp) / "g.trace")
            loaded = load_trace(path)
        jobs, cl, profile = list(loaded.jobs), load_cluster("4:4:4", 4), loaded.profile
    else:
        loaded = load_trace("elasticflow/elasticVpollux_e")
        jobs = list(with_scaling(loaded.jobs[:30], load_scaling("T4")))
        cl, profile = load_cluster("elasticflow/n16g4"), None

    def cfg(bus: str, url: str | None = None) -> SimConfig:
        return SimConfig(policy=policy, jobs=jobs, cluster=cl, bus=bus,  # type: ignore[arg-type]
                         nats_url=url, profile=profile, overhead="none")

    mem = await run_simulation(cfg("memory"))
    nats = await run_simulation(cfg("nats", nats_server.url))
    assert mem.summary["errors"] == 0 and nats.summary["errors"] == 0
    assert mem.summary["decision_digest"] == nats.summary["decision_digest"]
    assert _ends(mem) == _ends(nats)
