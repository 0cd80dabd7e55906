"""What each step does: the GPU backend, the workload families, preemption and MPS."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.gpuval.cluster import NODE, Cluster, gpu_processes
from bench.gpuval.probes import _comm, _telemetry_json, mps_processes, process_env, trainer_pids
from bench.gpuval.records import _trains_since, job_result, rate, runs_of
from bench.gpuval.report import Report, _fmt
from domain.trainer_config import TrainerConfig
from services.nodeagent.gpu import GpuBackend
from services.nodeagent.supervisor import ProcessSpec, job_environment

FAMILY_MODELS = {"cnn": "resnet18", "transformer": "gpt2", "lstm": "lstm", "rl": "a2c"}
# Muri interleaves jobs whose stages overlap: one data-heavy, one compute-heavy.
MPS_PAIR: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("cnn", (0.008, 0.002, 0.0)), ("transformer", (0.002, 0.008, 0.0)))


# -- step 2: the GPU backend -------------------------------------------------------------------
class LineReader:
    """The protocol records of a trainer this script started itself (step 2)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.records: list[dict[str, Any]] = []
        self.task = asyncio.create_task(self._read(proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            with contextlib.suppress(ValueError):
                rec = json.loads(raw)
                if isinstance(rec, dict) and "event" in rec:
                    self.records.append(rec)

    def count(self, event: str) -> int:
        return sum(r["event"] == event for r in self.records)


async def busy_telemetry(backend: GpuBackend, gpu_uuid: str, work: Path,
                         sample_s: float) -> dict[str, Any]:
    """telemetry() while a real trainer trains on `gpu_uuid`, in the agent's job environment."""
    cfg = TrainerConfig(job_id="gv-busy", model="transformer", iterations=10**7,
                        batch_size=256, checkpoint_dir=str(work / "busy-ckpt"), device="auto",
                        report_every=50, log_level="warning")
    argv = (sys.executable, "-m", "services.trainer", *cfg.to_argv())
    env = job_environment(ProcessSpec("gv-busy", argv, (gpu_uuid,)))
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    reader = LineReader(proc)
    out: dict[str, Any] = {"pid": proc.pid, "samples": [], "errors": []}
    try:
        deadline = time.monotonic() + 90
        while reader.count("progress") < 2:
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"busy trainer did not train (exit {proc.returncode}): "
                                   f"{reader.records[-1:]}")
            await asyncio.sleep(0.1)
        started = next(r for r in reader.records if r["event"] == "started")
        out["device"] = started["device"]
        end = time.monotonic() + sample_s
        while time.monotonic() < end:
            try:
                samples = await asyncio.to_thread(backend.telemetry)
                out["samples"].append(_telemetry_json(samples))
            except Exception as exc:
                out["errors"].append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.5)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader.task, 5)
    mine = [s for sample in out["samples"] for s in sample if s["uuid"] == gpu_uuid]
    out["max_utilization"] = max((s["utilization"] for s in mine), default=None)
    out["max_memory_used_mib"] = max((s["memory_used_mib"] for s in mine), default=None)
    seen = {p for s in mine for p in s["processes"]}
    out["pids_seen"] = {str(p): _comm(p) for p in sorted(seen)}
    out["trainer_pid_seen"] = proc.pid in seen
    out["exit_code"] = proc.returncode
    last = reader.records[-1]["event"] if reader.records else None
    out["last_record"] = last
    return out


async def attempt(report: Report, errors: dict[str, str], label: str,
                  call: Callable[[], Awaitable[Any]]) -> Any:
    """One backend call: its result, or None with the traceback printed and kept (a call that
    raises on a real GPU is a finding, and the calls after it still run)."""
    try:
        return await call()
    except Exception as exc:
        errors[label] = traceback.format_exc()
        report.finding(f"{label} raised {type(exc).__name__}: {exc}")
        print(errors[label], flush=True)
        return None


async def gpu_step(backend: GpuBackend, report: Report, work: Path, real: bool) -> None:
    gpu: dict[str, Any] = report.data.setdefault("gpu", {})
    errors: dict[str, str] = gpu.setdefault("errors", {})
    gpu["backend"] = backend.name
    report.measure("backend", backend.name)
    found = await asyncio.to_thread(backend.discover)  # nothing else runs without it
    gpu["discover"] = [{"index": g.index, "uuid": g.uuid, "name": g.name,
                        "memory_gib": round(g.memory_bytes / 2**30, 2),
                        "pci_bus_id": g.pci_bus_id} for g in found]
    report.measure("GPUs discovered", len(found))
    if not found:
        raise RuntimeError("discover() found no GPU")
    report.measure("GPU 0", f"{found[0].name}, {found[0].memory_bytes / 2**30:.1f} GiB, "
                            f"{found[0].uuid}, bus {found[0].pci_bus_id}")
    links = await attempt(report, errors, "topology()",
                          lambda: asyncio.to_thread(backend.topology))
    if links is not None:
        gpu["topology"] = [{"a": x.a, "b": x.b, "kind": x.kind} for x in links]
        report.measure("topology links", ", ".join(x.kind for x in links) or "none (one GPU)")
    idle = await attempt(report, errors, "telemetry() idle",
                         lambda: asyncio.to_thread(backend.telemetry))
    if idle is not None:
        gpu["telemetry_idle"] = _telemetry_json(idle)
        report.measure("idle util / memory used (GPU 0)",
                       f"{idle[0].utilization_ratio:.2f} / "
                       f"{idle[0].memory_used_bytes / 2**20:.0f} MiB")
    busy = await busy_telemetry(backend, found[0].uuid, work, 4.0 if real else 1.0)
    gpu["telemetry_busy"] = busy
    report.measure("busy trainer device", busy.get("device"))
    report.measure("busy util max / memory used max (GPU 0)",
                   f"{_fmt(busy['max_utilization'])} / {_fmt(busy['max_memory_used_mib'])} MiB")
    report.measure("busy trainer PID in telemetry processes", busy["trainer_pid_seen"])
    if busy["errors"]:
        report.finding(f"telemetry() raised while the trainer was busy: {busy['errors'][0]}")
    if real:
        if busy.get("device", "").startswith("cpu"):
            report.finding("the busy trainer ran on the CPU with GPU 0 visible (device auto)")
        if not busy["trainer_pid_seen"]:
            report.finding(f"telemetry().processes never listed the trainer's PID {busy['pid']}"
                           f" (saw {busy['pids_seen']})")
        if (busy["max_utilization"] or 0) <= 0:
            report.finding("telemetry() reported 0 utilisation while a trainer was busy")


# -- step 4: one job per workload family -------------------------------------------------------
async def families_step(cluster: Cluster, report: Report, iterations: int, cap_s: float,
                        real: bool) -> None:
    jobs = {f"gv-{family}": model for family, model in FAMILY_MODELS.items()}
    for job_id, model in jobs.items():
        await cluster.submit(job_id, model, iterations)
    rows = await cluster.wait_terminal(list(jobs), cap_s)
    await cluster.cancel_unfinished(rows, list(jobs), report)
    results = {}
    for (job_id, model), family in zip(jobs.items(), FAMILY_MODELS, strict=True):
        res = job_result(cluster, job_id, rows.get(job_id, {}))
        res.update(family=family, model=model)
        results[family] = res
        report.measure(f"{family} ({model}) it/s alone",
                       f"{_fmt(res.get('it_per_s'))} [{res['state']}, "
                       f"{res['iterations_done']}/{iterations} it, {res.get('device')}, "
                       f"startup {_fmt(res.get('startup_s'))} s]")
        if real and str(res.get("device", "")).startswith("cpu"):
            report.finding(f"{job_id} trained on the CPU on a GPU node (device auto)")
        if real and res.get("pid_in_telemetry") is False:
            report.finding(f"{job_id}: its trainer's PID never appeared in telemetry processes")
    report.data["families"] = results
    beats = [hb for _, hb in cluster.heartbeats]
    gpu_samples = [g for hb in beats for g in hb.gpus]
    report.data["heartbeats"] = {
        "count": len(beats), "with_gpu_samples": sum(1 for hb in beats if hb.gpus),
        "max_utilization": max((g.utilization_ratio for g in gpu_samples), default=None),
        "max_memory_used_mib": max((g.memory_used_bytes / 2**20 for g in gpu_samples),
                                   default=None)}
    hb = report.data["heartbeats"]
    report.measure("heartbeats (with GPU samples) / max util in them",
                   f"{hb['count']} ({hb['with_gpu_samples']}) / {_fmt(hb['max_utilization'])}")
    if beats and not hb["with_gpu_samples"]:
        report.finding("the node agent's heartbeats carried no GPU telemetry")
    if not all(r["state"] == "finished" and r["iterations_done"] == iterations
               for r in results.values()):
        raise RuntimeError("not every family job finished its iterations: "
                           + ", ".join(f"{f}: {r['state']} {r['iterations_done']}"
                                       for f, r in results.items()))


# -- step 5: preempted and resumed ---------------------------------------------------------------
async def preemption_step(cluster: Cluster, report: Report, iterations: int,
                          cap_s: float) -> None:
    job, tap = "gv-preempt", cluster.tap
    total = 2 * iterations
    await cluster.submit(job, "resnet18", total)
    await tap.wait(job, lambda r: r["event"] == "progress" and r["iteration"] >= iterations // 4,
                   cap_s / 2)
    n = len(tap.records.get(job, []))
    t_suspend = time.monotonic()
    said = await cluster.operate("suspend", job)
    t_stopped, stopped = await tap.wait(job, lambda r: r["event"] == "stopped", 60, since=n)
    ckpts = [r for r in tap.of(job)[n:] if r["event"] == "checkpointed"]
    res: dict[str, Any] = {"suspend": said, "stopped_at": stopped["iteration"],
                           "stop_latency_s": t_stopped - t_suspend,
                           "loss_at_stop": stopped.get("loss")}
    if ckpts:
        res.update(checkpoint_write_s=ckpts[-1]["write_s"], checkpoint_bytes=ckpts[-1]["bytes"],
                   checkpoint_reason=ckpts[-1]["reason"])
    # Resume once the stopped run is gone, so the restart is measured from a free GPU.
    deadline = time.monotonic() + 30
    while job in trainer_pids() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    res["exit_after_stop_s"] = time.monotonic() - t_suspend
    n = len(tap.records.get(job, []))
    t_resume = time.monotonic()
    res["resume"] = await cluster.operate("resume", job)
    t_started, started = await tap.wait(job, lambda r: r["event"] == "started", 60, since=n)
    t_first, first = await tap.wait(job, lambda r: r["event"] == "progress", 60, since=n)
    res.update(restart_latency_s=t_started - t_resume, trainer_startup_s=started["startup_s"],
               time_to_first_progress_s=t_first - t_resume, resumed=started["resumed"],
               resumed_at=started["iteration"], first_loss_after=first.get("loss"),
               device=started.get("device"))
    rows = await cluster.wait_terminal([job], cap_s / 2)
    await cluster.cancel_unfinished(rows, [job], report)
    res.update(job_result(cluster, job, rows.get(job, {})))
    report.data["preemption"] = res
    report.measure("preempt: stopped at / resumed at (iteration)",
                   f"{res['stopped_at']} / {res['resumed_at']} (resumed={res['resumed']})")
    report.measure("preempt: suspend → stopped (s)", res["stop_latency_s"])
    report.measure("preempt: checkpoint write (s) / size (bytes)",
                   f"{_fmt(res.get('checkpoint_write_s'))} / {_fmt(res.get('checkpoint_bytes'))}")
    report.measure("preempt: resume → started (s) / trainer startup (s)",
                   f"{res['restart_latency_s']:.3g} / {res['trainer_startup_s']:.3g}")
    report.measure("preempt: resume → first progress (s)", res["time_to_first_progress_s"])
    report.measure("preempt: final state / iterations",
                   f"{res['state']} / {res['iterations_done']}/{total}")
    if not (res["resumed"] and res["resumed_at"] == res["stopped_at"] > 0):
        raise RuntimeError(f"did not resume from its checkpoint: stopped at "
                           f"{res['stopped_at']}, started at {res['resumed_at']}")
    if res["state"] != "finished" or res["iterations_done"] != total:
        raise RuntimeError(f"resumed job ended {res['state']} at {res['iterations_done']}")


# -- step 6: two jobs interleaved on one GPU under MPS -------------------------------------------
async def mps_step(cluster: Cluster, report: Report, iterations: int, cap_s: float,
                   target_s: float, real: bool) -> None:
    res: dict[str, Any] = {}
    report.data["mps"] = res
    res["set_policy"] = await cluster.operate("set-policy", policy="muri-s")
    alone = report.data.get("families", {})
    jobs: dict[str, tuple[str, tuple[float, ...], int]] = {}
    for family, stages in MPS_PAIR:
        # About `target_s` of training each at the rate measured alone, so that they overlap.
        measured = alone.get(family, {}).get("it_per_s") or 0.0
        jobs[f"gv-mps-{family}"] = (FAMILY_MODELS[family], stages,
                                    max(2 * iterations, int(measured * target_s)))
    n_cmds = len(cluster.commands)
    for job_id, (model, stages, total) in jobs.items():
        await cluster.submit(job_id, model, total, stages)
    res["iterations"] = {j: total for j, (_, _, total) in jobs.items()}
    # Both trainers training at once in runs launched as a group (a job that started alone
    # is stopped and relaunched with its partner: wait for the new runs, not the old). Which
    # run is which comes from the agent: a solo run can report its start after the grouped
    # launch was seen, while it is being stopped, so the records' times cannot tell.
    deadline = time.monotonic() + cap_s / 2
    current: dict[str, tuple[int, float]] = {}  # job → (grouped run's PID, first seen)
    while True:
        grouped = [(t, x) for t, c in cluster.commands[n_cmds:] for x in c.launches
                   if x.job_id in jobs and len(x.colocated) > 1]
        since = min((t for t, _ in grouped), default=math.inf)
        now = time.monotonic()
        for j in jobs:
            pid = cluster.tap.grouped_pid(j)
            if pid is None:
                current.pop(j, None)
            elif current.get(j, (None, 0.0))[0] != pid:
                current[j] = (pid, now)
        # Polled far more often than a trainer starts, so its start record comes after.
        pids = {j: pid for j, (pid, _) in current.items()}
        if len(current) == len(jobs) and all(
                _trains_since(cluster.tap, j, max(since, current[j][1])) for j in jobs):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pair did not train co-located (launches with partners: "
                               f"{[(x.job_id, x.colocated) for _, x in grouped]}, trainers: "
                               f"{pids}, records: {[cluster.tap.of(j)[-1:] for j in jobs]})")
        await asyncio.sleep(0.2)
    # From the grouped launch to its trainers' start: the agent starts the MPS daemon first.
    spawned = {j: max(since, seen) for j, (_, seen) in current.items()}  # the grouped runs
    res["grouped_launch_to_started_s"] = {
        j: round(next(t for t, r in cluster.tap.records[j]
                      if t >= spawned[j] and r["event"] == "started") - since, 2) for j in jobs}
    res["trainer_env"] = {j: process_env(pid) for j, pid in pids.items() if j in jobs}
    res["mps_processes"] = {str(k): v for k, v in mps_processes().items()}
    await asyncio.sleep(1.0)  # a telemetry sample with both trainers on the GPU
    res["gpu_processes"] = gpu_processes(cluster)
    for j, env in res["trainer_env"].items():
        report.measure(f"{j} CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                       env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
    report.measure("MPS daemon/server processes", ", ".join(res["mps_processes"].values())
                   or "none")
    rows = await cluster.wait_terminal(list(jobs), cap_s / 2)
    await cluster.cancel_unfinished(rows, list(jobs), report)
    res["launches"] = [{"job": x.job_id, "colocated": list(x.colocated), "cycle": c.cycle}
                       for _, c in cluster.commands[n_cmds:] for x in c.launches
                       if x.job_id in jobs]
    res["stops"] = [{"job": s.job_id, "reason": s.reason, "cycle": c.cycle}
                    for _, c in cluster.commands[n_cmds:] for s in c.stops if s.job_id in jobs]
    # Iterations/s while both trained: the overlap of the progress of their grouped runs (a
    # job whose partner finished is relaunched alone: that run is not counted).
    grouped_runs = {j: next((r for r in runs_of(cluster.tap.records.get(j, []))
                             if r.t_started >= spawned[j]), None) for j in jobs}
    spans = [(r.progress[0]["ts"], r.progress[-1]["ts"])
             for r in grouped_runs.values() if r is not None and r.progress]
    lo, hi = (max(s[0] for s in spans), min(s[1] for s in spans)) if len(spans) == 2 else (0, 0)
    res["overlap_s"] = round(max(0.0, hi - lo), 2)
    both = [s for s in cluster.samples
            if "telemetry" in s and all(j in s["trainers"] for j in jobs)]
    res["max_utilization_colocated"] = max(
        (t["utilization"] for s in both for t in s["telemetry"]), default=None)
    res["jobs"] = {}
    for j in jobs:
        family = j.removeprefix("gv-mps-")
        result = job_result(cluster, j, rows.get(j, {}))
        run = grouped_runs[j]
        result["device_colocated"] = run.started.get("device") if run else None
        result["it_per_s_colocated"] = rate(run.progress, lo, hi) if run and hi > lo else None
        result["it_per_s_alone"] = alone.get(family, {}).get("it_per_s")
        if result["it_per_s_colocated"] and result["it_per_s_alone"]:
            result["colocated_over_alone"] = (result["it_per_s_colocated"]
                                              / result["it_per_s_alone"])
        res["jobs"][j] = result
        report.measure(f"{j} it/s alone → co-located",
                       f"{_fmt(result['it_per_s_alone'])} → "
                       f"{_fmt(result['it_per_s_colocated'])} "
                       f"(×{_fmt(result.get('colocated_over_alone'))}, {result['state']}, "
                       f"{result['device_colocated']})")
        if real and str(result["device_colocated"]).startswith("cpu"):
            report.finding(f"{j} trained on the CPU under MPS (CUDA unusable in the client?)")
    report.measure("co-located overlap (s) / max util while both ran",
                   f"{res['overlap_s']} / {_fmt(res['max_utilization_colocated'])}")
    report.measure("co-located launches / stops",
                   f"{len(res['launches'])} / {len(res['stops'])} "
                   f"({', '.join(s['job'] + ' ' + s['reason'] for s in res['stops'])})")
    logs = cluster.work / "mps" / NODE / "log"  # the agent's MpsControl.log_dir
    res["mps_logs"] = {p.name: p.read_text(errors="replace")[-3000:]
                       for p in sorted(logs.glob("*.log"))}
    if any(r["state"] != "finished" for r in res["jobs"].values()):
        raise RuntimeError("co-located jobs: " + ", ".join(
            f"{j}: {r['state']} {r.get('failure') or ''}" for j, r in res["jobs"].items()))
    pcts = {e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") for e in res["trainer_env"].values()}
    if pcts != {"50"}:
        raise RuntimeError(f"co-located trainers' active-thread percentages: {pcts}")

