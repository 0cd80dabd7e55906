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
import signal
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
from schemas.events import JobTransitionV1, TrainerReport
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


async def run_demo(out: Path | None, console: Console, timeout_s: float,
                   log_level: str = "warning") -> int:
    """The whole demo, bounded by `timeout_s` from start to summary; SIGINT and SIGTERM stop
    it, and either way its processes and temporary folders are gone when it returns."""
    deadline = time.monotonic() + timeout_s
    log_file = (out or Path("runs") / "demo") / "loom-demo.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_bytes(b"")
    console.print(f"loom demo: services' and trainers' output goes to {log_file}")
    signalled: list[signal.Signals] = []
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def interrupt(sig: signal.Signals) -> None:
        if not signalled and main is not None:  # once: a second Ctrl-C must not cut cleanup
            main.cancel()
        signalled.append(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt, sig)
    tmp = tempfile.TemporaryDirectory(prefix="loom-demo-")
    stop = asyncio.Event()
    cluster_task: asyncio.Task[int] | None = None
    summary: dict[str, Any] | None = None
    code = 1
    try:
        cluster = ClusterSpec.uniform(1, 2, 2, gpu_type="fake", name="demo")
        spec = Path(tmp.name) / "cluster.json"
        spec.write_text(cluster.model_dump_json())
        port = free_port()
        ready = asyncio.Event()
        opts = UpOptions(cluster, str(spec), policy="srtf", round_s=ROUND_S,
                         trainers="pytorch", gpus_per_node=2, state_dir=Path(tmp.name),
                         prometheus_port=port, nats_port=None, log_file=log_file,
                         log_level=log_level, announce=False)
        url_box: list[str] = []
        cluster_task = asyncio.create_task(up(opts, ready=ready, stop=stop, url_out=url_box))
        try:
            await asyncio.wait_for(_first(ready, cluster_task), _left(deadline))
        except TimeoutError:
            console.print(f"[red]loom demo:[/red] the local cluster did not come up within "
                          f"{timeout_s:g} s (--timeout); see {log_file}")
            return 1
        summary = await _drive(url_box[0], port, console, deadline, log_file)
    except asyncio.CancelledError:
        if not signalled or main is None:
            raise
        main.uncancel()  # our own cancellation, taken: the cleanup below awaits
    finally:
        stop.set()
        if cluster_task is not None:
            code = await cluster_task
        tmp.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if signalled:
        console.print(f"loom demo: stopped by {signalled[0].name}; everything it started is "
                      f"gone (output in {log_file})")
        return 128 + int(signalled[0])
    assert summary is not None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        summary["versions"] = running_versions()  # the local cluster runs this installation
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        console.print(f"wrote {out / 'summary.json'}")
    if not summary["all_finished"]:
        console.print(f"[red]loom demo:[/red] not every job finished within {timeout_s:g} s "
                      f"(--timeout); see {log_file}")
    ok = summary["all_finished"] and code == 0
    return 0 if ok else 1


def _left(deadline: float) -> float:
    """Seconds until `deadline` (at least a little, so a last request can be made)."""
    return max(0.5, deadline - time.monotonic())


async def _first(ready: asyncio.Event, task: asyncio.Task[int]) -> None:
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        raise RuntimeError(f"the local cluster did not come up (exit {task.result()})")


def failure_line(t: JobTransitionV1, log_file: Path) -> str | None:
    """One console line for a failed run of a job (retried, or the job failed; the trainer's
    traceback is in the log), else None."""
    why = t.why()
    if why.kind not in ("retry", "failed"):
        return None
    text = why.text.splitlines()[0] if why.text else "failed"
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{t.job_id}: {text} (traceback in {log_file})"


async def _drive(url: str, prometheus_port: int, console: Console, deadline: float,
                 log_file: Path) -> dict[str, Any]:
    nc = await nats.connect(url)
    reports: dict[str, list[TrainerReport]] = {j.job_id: [] for j in BATCH}

    async def on_report(msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, TrainerReport) and body.job_id in reports:
            reports[body.job_id].append(body)

    async def on_transition(msg: Any) -> None:
        body = decode(msg.data).body
        if isinstance(body, JobTransitionV1):
            line = failure_line(body, log_file)
            if line is not None:
                console.print(line, style="yellow", highlight=False, markup=False)

    await nc.subscribe(subjects.JOB_PROGRESS, cb=on_report)
    await nc.subscribe(subjects.JOB_TRANSITION, cb=on_transition)
    js = nc.jetstream()
    await ensure_stream(js)
    for job in BATCH:
        if job.wave == 1:
            await _trained(reports, WAVE_AFTER, [j.job_id for j in BATCH if j.wave == 0],
                           deadline)
        body = {"job_id": job.job_id, "model": job.model, "gpus": job.gpus,
                "iterations": job.iterations, "iteration_time_s": ITERATION_S,
                "tenant": "demo"}
        await js.publish(subjects.JOB_SUBMIT, json.dumps(body).encode(),
                         headers={MSG_ID: f"submit.{job.job_id}"})
        console.print(f"submitted {job.job_id}: {job.model}, {job.gpus} GPU(s), "
                      f"{job.iterations} iterations")
    last = ""
    state: dict[str, Any] = {}
    while True:
        state = json.loads((await nc.request(control_subject("scheduler"), b"",
                                             timeout=min(10.0, max(2.0, _left(deadline)))
                                             )).data)
        view = _table(state)
        rows = " ".join(f"{j['job_id']}:{j['state']}" for j in state["jobs"])
        if rows != last:
            console.print(view)
            last = rows
        if len(state["jobs"]) == len(BATCH) and all(
                j["state"] == "finished" for j in state["jobs"]):
            break
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(1.0, _left(deadline)))
    await asyncio.sleep(0.5)  # the last transitions reach the metrics service
    metrics = json.loads((await nc.request(control_subject("metrics"), b"", timeout=5)).data)
    await nc.close()
    scrape = urllib.request.urlopen(
        f"http://127.0.0.1:{prometheus_port}/metrics", timeout=5).read().decode()
    summary = _summary(state, metrics["summary"], reports, scrape)
    _print_summary(summary, console)
    return summary


async def _trained(reports: dict[str, list[TrainerReport]], iterations: int,
                   jobs: list[str], deadline: float) -> None:
    """Until each of `jobs` has reported `iterations` (or the demo's deadline passed)."""
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
