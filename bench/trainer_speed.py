"""Trainer speed: per-model throughput and stage times, 1 rank and 2 gloo ranks; preemption cost.

Launches real `python -m services.trainer` processes (1 CPU thread per rank) and reads their
progress records. Prints, per model and world size: iterations/s and samples/s over the
measured iterations, and the mean data / compute / communication seconds per iteration (what
Muri's resource_time_0..2 and Gavel's throughput tables hold). Then one stop/resume cycle per
model: SIGTERM → exit (step + checkpoint), the checkpoint's size and write time, and the
restarted launch's startup (imports, rendezvous, restore) until it trains again.

    .venv/bin/python bench/trainer_speed.py                        # all models, 200 iterations
    .venv/bin/python bench/trainer_speed.py --models cnn --iterations 500 --batch-size 64
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time

from schemas.trainer import Checkpointed, Finished, Progress, Record, Started, decode


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmd(model: str, iterations: int, batch: int, ckpt: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "services.trainer", "--job-id", f"bench-{model}", "--model",
            model, "--iterations", str(iterations), "--batch-size", str(batch),
            "--checkpoint-dir", ckpt, "--threads", "1", "--log-level", "warning", *extra]


def _records(out: str) -> list[Record]:
    return [decode(line) for line in out.splitlines() if line.strip()]


def throughput(model: str, world: int, iterations: int, batch: int) -> dict[str, float]:
    port = str(_port())
    with tempfile.TemporaryDirectory() as ckpt:
        procs = [subprocess.Popen(
            _cmd(model, iterations, batch, ckpt, "--world-size", str(world), "--rank", str(r),
                 "--master-port", port, "--warmup", "5"),
            stdout=subprocess.PIPE, text=True) for r in range(world)]
        outs = [p.communicate()[0] for p in procs]
    records = _records(outs[0])
    finished = next(r for r in records if isinstance(r, Finished))
    started = next(r for r in records if isinstance(r, Started))
    prof = finished.profile
    assert prof is not None
    return {"it_s": 1 / prof.iteration_s, "samples_s": batch / prof.iteration_s,
            "data_ms": 1e3 * prof.data_s, "compute_ms": 1e3 * prof.compute_s,
            "comm_ms": 1e3 * prof.comm_s, "startup_s": started.startup_s}


def preemption(model: str, batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as ckpt:
        first = subprocess.Popen(_cmd(model, 10**6, batch, ckpt, "--report-every", "20"),
                                 stdout=subprocess.PIPE, text=True)
        assert first.stdout is not None
        for line in first.stdout:
            if isinstance(decode(line), Progress):
                break
        t0 = time.monotonic()
        first.send_signal(signal.SIGTERM)
        out = first.stdout.read()
        first.wait()
        stop_s = time.monotonic() - t0
        ckpt_rec = next(r for r in _records(out) if isinstance(r, Checkpointed))
        t1 = time.monotonic()
        second = subprocess.Popen(_cmd(model, ckpt_rec.iteration + 20, batch, ckpt,
                                       "--report-every", "1"),
                                  stdout=subprocess.PIPE, text=True)
        assert second.stdout is not None
        started: Started | None = None
        first_step_s = 0.0
        for line in second.stdout:
            rec = decode(line)
            if isinstance(rec, Started):
                started = rec
            if isinstance(rec, Progress):
                first_step_s = time.monotonic() - t1
                break
        second.communicate()
    assert started is not None
    return {"stop_s": stop_s, "ckpt_kb": ckpt_rec.bytes / 1024, "write_ms": 1e3 * ckpt_rec.write_s,
            "startup_s": started.startup_s, "restart_to_step_s": first_step_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cnn,transformer,lstm,rl")
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    models = args.models.split(",")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, load "
          f"{os.getloadavg()[0]:.1f}; batch {args.batch_size} (global), 1 thread per rank")
    print(f"{'model':12} {'ranks':>5} {'it/s':>8} {'samples/s':>10} {'data ms':>8} "
          f"{'compute ms':>10} {'comm ms':>8} {'startup s':>9}")
    for model in models:
        for world in (int(w) for w in args.worlds.split(",")):
            r = throughput(model, world, args.iterations, args.batch_size)
            print(f"{model:12} {world:>5} {r['it_s']:>8.1f} {r['samples_s']:>10.0f} "
                  f"{r['data_ms']:>8.2f} {r['compute_ms']:>10.2f} {r['comm_ms']:>8.2f} "
                  f"{r['startup_s']:>9.2f}")
    print(f"\n{'model':12} {'SIGTERM→exit s':>14} {'ckpt KiB':>9} {'write ms':>9} "
          f"{'startup s':>9} {'relaunch→1st step s':>19}")
    for model in models:
        r = preemption(model, args.batch_size)
        print(f"{model:12} {r['stop_s']:>14.2f} {r['ckpt_kb']:>9.0f} {r['write_ms']:>9.1f} "
              f"{r['startup_s']:>9.2f} {r['restart_to_step_s']:>19.2f}")


if __name__ == "__main__":
    main()
