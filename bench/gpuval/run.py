"""The steps in order, each within the budget, then the teardown and the summary."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.gpuval.cluster import (
    Cluster,
    find_mps_control,
    make_backend,
    start_cluster,
    stop_cluster,
)
from bench.gpuval.probes import doctor, environment, mps_processes, process_group
from bench.gpuval.report import TEARDOWN_S, Budget, Report, print_summary, run_step
from bench.gpuval.steps import families_step, gpu_step, mps_step, preemption_step
from services.nodeagent.gpu import FakeBackend, GpuBackend


# -- the plan and the run -------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    iterations: int  # a family job's; the preempted and co-located jobs run twice as many
    family_cap_s: float
    preempt_cap_s: float
    mps_cap_s: float
    mps_target_s: float  # each co-located job runs about this long at its rate alone


def plan_for(real: bool, iterations: int | None) -> Plan:
    if real:  # the trainer's small models run a few hundred iterations a second on a GPU
        return Plan(iterations or 1500, 120.0, 75.0, 75.0, 10.0)
    return Plan(iterations or 60, 90.0, 60.0, 60.0, 2.0)


async def main_async(args: argparse.Namespace) -> int:
    real = args.fake_gpus is None
    report = Report("real" if real else f"fake ({args.fake_gpus} GPUs)", args.out)
    budget = Budget(args.budget_s)
    plan = plan_for(real, args.iterations)
    report.data["plan"] = {"iterations": plan.iterations, "budget_s": args.budget_s}
    work = Path(tempfile.mkdtemp(prefix="lgv-"))  # short: MPS pipe paths are Unix sockets
    report.data["work_dir"] = str(work)

    async def env_step() -> None:
        env = await asyncio.to_thread(environment)
        report.data["environment"] = env
        for key in ("nvidia_smi_L", "nvidia_smi_query", "torch", "torch_cuda", "cuda_available",
                    "device_name", "nccl", "mps_control", "nvidia_ml_py"):
            report.measure(key, env.get(key))
        for key in ("cuda_error", "nccl_error", "torch_probe_error"):
            if env.get(key):
                report.measure(key, env[key])

    await run_step(report, budget, "environment", 150, env_step)

    async def doctor_step() -> None:
        report.data["doctor"] = await asyncio.to_thread(doctor, work, args.fake_gpus)
        for check in report.data["doctor"].get("checks", []):
            gpu = "" if check.get("gpu") is None else f"_gpu{check['gpu']}"
            report.measure(f"doctor_{check.get('check')}{gpu}",
                           f"{check.get('status')}: {check.get('measured', '')}")

    await run_step(report, budget, "doctor", 60, doctor_step)
    mps_binary = find_mps_control(report)

    backend: GpuBackend | None = None

    async def backend_step() -> None:
        nonlocal backend
        backend = await asyncio.to_thread(make_backend, args.fake_gpus, report)
        await gpu_step(backend, report, work, real)

    await run_step(report, budget, "gpu_backend", 150, backend_step)
    started: list[Cluster] = []
    cluster: Cluster | None = None
    try:
        async def cluster_step() -> None:
            nonlocal cluster
            probe = backend if backend is not None else FakeBackend(0)
            gpus = args.fake_gpus if not real else len(probe.discover())
            cluster = await start_cluster(work, args.fake_gpus, max(1, gpus), report, probe,
                                          started)

        up = await run_step(report, budget, "cluster", 90, cluster_step)
        no_cluster = None if up and cluster is not None else "the cluster did not start"

        async def families() -> None:
            assert cluster is not None
            await families_step(cluster, report, plan.iterations, plan.family_cap_s, real)

        async def preempt() -> None:
            assert cluster is not None
            await preemption_step(cluster, report, plan.iterations, plan.preempt_cap_s)

        async def mps() -> None:
            assert cluster is not None
            await mps_step(cluster, report, plan.iterations, plan.mps_cap_s, plan.mps_target_s,
                           real)

        await run_step(report, budget, "families", plan.family_cap_s + 10, families,
                       skip=no_cluster)
        await run_step(report, budget, "preemption", plan.preempt_cap_s + 10, preempt,
                       skip=no_cluster)
        no_mps = no_cluster or (None if mps_binary or not real
                                else "nvidia-cuda-mps-control is not on PATH")
        await run_step(report, budget, "mps", plan.mps_cap_s + 10, mps, skip=no_mps)
    finally:
        TERMINATION.tearing_down = True  # a SIGTERM from now on is noted, not obeyed
        groups = {"self": process_group(os.getpid()),
                  **{f"{pid} {name}": process_group(pid) for pid, name in mps_processes().items()}}
        report.data.setdefault("teardown", {})["process_groups"] = groups
        for half in started:  # the cluster, or what of it started before a failure
            print("== teardown", flush=True)
            try:
                await asyncio.wait_for(stop_cluster(half, report), TEARDOWN_S + 60)
            except (Exception, asyncio.CancelledError) as exc:
                report.finding(f"teardown: {type(exc).__name__}: {exc}")
        for when, phase in TERMINATION.received:
            report.finding(f"SIGTERM received {when - report.started:.1f} s in, during {phase}")
        if real and mps_processes():
            report.finding(f"MPS processes still running after the agent stopped: "
                           f"{mps_processes()}")
        if backend is not None:
            with contextlib.suppress(Exception):
                backend.close()
        shutil.rmtree(work, ignore_errors=True)
        path = report.write()
        print_summary(report)
        print(f"wrote {path}", flush=True)
    ran = [s for s in report.steps.values() if not s.get("skipped")]
    return 0 if ran and all(s["ok"] for s in ran) else 1


@dataclass
class Termination:
    tearing_down: bool = False
    received: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, phase)


TERMINATION = Termination()
