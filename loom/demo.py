"""`loom demo`: a local cluster, a mixed batch of real training jobs, live status, a summary.

It brings up NATS, the control plane and two node agents with two fake GPUs each (every "GPU"
runs one CPU trainer process), submits six PyTorch jobs of the four workload families, 1- and
2-GPU (the 2-GPU ones data-parallel over gloo), under SRTF in 5 s rounds: short jobs submitted
once the long ones have trained a while preempt them; they checkpoint, and later resume. It
prints the status as it changes, then a summary (JCTs, preemptions, resumes with the loss
before and after), checks the Prometheus endpoint, and tears everything down.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from rich.console import Console
from rich.table import Table

from loom.serve import control_subject
from loom.up import UpOptions, up
from loom.versions import running_versions
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import decode
from schemas.events import TrainerReport
from services.runtime.bus import MSG_ID
from services.runtime.nats_live import ensure_stream
from services.runtime.natsserver import free_port


@dataclass(frozen=True)
class DemoJob:
    job_id: str
    model: str
    gpus: int
    iterations: int
    wave: int  # 0: at once; 1: once every wave-0 job has trained `WAVE_AFTER` iterations


BATCH = (
    DemoJob("cnn-2gpu", "resnet18", 2, 800, 0),
    DemoJob("lm-2gpu", "bert", 2, 500, 0),
    DemoJob("lstm-1gpu", "lstm", 1, 120, 1),
    DemoJob("rl-1gpu", "a2c", 1, 120, 1),
    DemoJob("cnn-1gpu", "vgg16", 1, 150, 1),
    DemoJob("gpt-1gpu", "gpt2", 1, 150, 1),
)
WAVE_AFTER = 100  # iterations: the long jobs have checkpointable progress to lose
ROUND_S = 5.0  # SRTF re-plans in short rounds: preemptions come at round boundaries
ITERATION_S = 0.05  # the submission's speed estimate (SRTF orders by it until reports arrive)


async def run_demo(out: Path | None, console: Console, timeout_s: float) -> int:
    tmp = tempfile.TemporaryDirectory(prefix="loom-demo-")
    cluster = ClusterSpec.uniform(1, 2, 2, gpu_type="fake", name="demo")
    spec = Path(tmp.name) / "cluster.json"
    spec.write_text(cluster.model_dump_json())
    port = free_port()
    ready, stop = asyncio.Event(), asyncio.Event()
    opts = UpOptions(cluster, str(spec), policy="srtf", round_s=ROUND_S, trainers="pytorch",
                     gpus_per_node=2, state_dir=Path(tmp.name), prometheus_port=port)
    url_box: list[str] = []
    cluster_task = asyncio.create_task(up(opts, ready=ready, stop=stop, url_out=url_box))
    try:
        await asyncio.wait_for(_first(ready, cluster_task), 120)
        summary = await _drive(url_box[0], port, console, timeout_s)
    finally:
        stop.set()
        code = await cluster_task
        tmp.cleanup()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        summary["versions"] = running_versions()  # the local cluster runs this installation
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        console.print(f"wrote {out / 'summary.json'}")
    ok = summary["all_finished"] and code == 0
    return 0 if ok else 1


async def _first(ready: asyncio.Event, task: asyncio.Task[int]) -> None:
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        raise RuntimeError(f"the local cluster did not come up (exit {task.result()})")


async def _drive(url: str, prometheus_port: int, console: Console,
                 timeout_s: float) -> dict[str, Any]:
    nc = await nats.connect(url)
    reports: dict[str, list[TrainerReport]] = {j.job_id: [] for j in BATCH}

    async def on_report(msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, TrainerReport) and body.job_id in reports:
            reports[body.job_id].append(body)

    await nc.subscribe(subjects.JOB_PROGRESS, cb=on_report)
    js = nc.jetstream()
    await ensure_stream(js)
    for job in BATCH:
        if job.wave == 1:
            await _trained(reports, WAVE_AFTER, [j.job_id for j in BATCH if j.wave == 0])
        body = {"job_id": job.job_id, "model": job.model, "gpus": job.gpus,
                "iterations": job.iterations, "iteration_time_s": ITERATION_S,
                "tenant": "demo"}
        await js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                         headers={MSG_ID: f"submit.{job.job_id}"})
        console.print(f"submitted {job.job_id}: {job.model}, {job.gpus} GPU(s), "
                      f"{job.iterations} iterations")
    last = ""
    deadline = time.monotonic() + timeout_s
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = json.loads((await nc.request(control_subject("scheduler"), b"",
                                             timeout=10)).data)
        view = _table(state)
        rows = " ".join(f"{j['job_id']}:{j['state']}" for j in state["jobs"])
        if rows != last:
            console.print(view)
            last = rows
        if len(state["jobs"]) == len(BATCH) and all(
                j["state"] == "finished" for j in state["jobs"]):
            break
        await asyncio.sleep(1.0)
    await asyncio.sleep(0.5)  # the last transitions reach the metrics service
    metrics = json.loads((await nc.request(control_subject("metrics"), b"", timeout=10)).data)
    await nc.close()
    scrape = urllib.request.urlopen(
        f"http://127.0.0.1:{prometheus_port}/metrics", timeout=5).read().decode()
    summary = _summary(state, metrics["summary"], reports, scrape)
    _print_summary(summary, console)
    return summary


async def _trained(reports: dict[str, list[TrainerReport]], iterations: int,
                   jobs: list[str], wait_s: float = 120.0) -> None:
    """Until each of `jobs` has reported `iterations` (or `wait_s` passed)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not all(
            any(r.iteration >= iterations for r in reports[j]) for j in jobs):
        await asyncio.sleep(0.2)


def _table(state: dict[str, Any]) -> Table:
    table = Table(title=f"t={state['now']:.0f} s · policy {state['policy']}")
    for col in ("job", "model", "state", "GPUs", "progress", "reason"):
        table.add_column(col)
    for j in state["jobs"]:
        table.add_row(j["job_id"], j["model"], j["state"], str(j["gpus"]),
                      f"{100 * j['done'] / j['iterations']:.0f}%", j["reason"])
    return table


def _summary(state: dict[str, Any], metrics: dict[str, Any],
             reports: dict[str, list[TrainerReport]], scrape: str) -> dict[str, Any]:
    jobs = {j["job_id"]: j for j in state["jobs"]}
    per_job = []
    for job in BATCH:
        rs = reports[job.job_id]
        resumes = [r for r in rs if r.event == "started" and r.resumed]
        stops = [r for r in rs if r.event == "stopped"]
        finished = [r for r in rs if r.event == "finished"]
        per_job.append({
            "job_id": job.job_id, "model": job.model, "gpus": job.gpus,
            "iterations": job.iterations,
            "state": jobs.get(job.job_id, {}).get("state"),
            "trainer_iterations": finished[-1].iteration if finished else None,
            "final_loss": finished[-1].loss if finished else None,
            "stops": [{"iteration": r.iteration, "loss": r.loss} for r in stops],
            "resumed_at": [r.iteration for r in resumes],
            "first_loss_after_resume": _first_loss_after(rs),
        })
    return {
        "all_finished": all(p["state"] == "finished"
                            and p["trainer_iterations"] == p["iterations"] for p in per_job),
        "jobs": per_job,
        "avg_jct_s": metrics.get("avg_jct_s"),
        "finished": metrics.get("finished"),
        "prometheus_finished": _metric(scrape, 'loom_jobs{state="finished"}'),
        "prometheus_jct_count": _metric(scrape, "loom_job_completion_seconds_count"),
        "prometheus_gpus_reporting": sum(
            1 for line in scrape.splitlines() if line.startswith("loom_gpu_utilization_ratio{")),
    }


def _first_loss_after(reports: list[TrainerReport]) -> float | None:
    resumed = False
    for r in reports:
        if r.event == "started" and r.resumed:
            resumed = True
        elif resumed and r.loss is not None:
            return r.loss
    return None


def _metric(scrape: str, name: str) -> float | None:
    for line in scrape.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def _print_summary(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="loom demo: summary")
    for col in ("job", "model", "GPUs", "iterations", "preempted at", "loss before → after",
                "final loss"):
        table.add_column(col)
    for p in summary["jobs"]:
        stops = ", ".join(str(s["iteration"]) for s in p["stops"]) or "-"
        before = p["stops"][0]["loss"] if p["stops"] else None
        after = p["first_loss_after_resume"]
        around = "-" if before is None or after is None else f"{before:.3f} → {after:.3f}"
        final = "-" if p["final_loss"] is None else f"{p['final_loss']:.3f}"
        table.add_row(p["job_id"], p["model"], str(p["gpus"]),
                      f"{p['trainer_iterations']}/{p['iterations']}", stops, around, final)
    console.print(table)
    jct, found, jcts = (summary["avg_jct_s"], summary["prometheus_finished"],
                        summary["prometheus_jct_count"])
    console.print(f"avg JCT {jct or 0:.1f} s over {summary['finished']} jobs; Prometheus: "
                  f"{found or 0:.0f} finished, {jcts or 0:.0f} JCTs observed, "
                  f"{summary['prometheus_gpus_reporting']} GPUs reporting")
