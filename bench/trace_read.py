"""Reading a production trace: a generated Helios-format `cluster_log.csv` through `load_trace`.

Writes `--rows` rows (default 1,000,000) in Helios' exact layout into a temporary folder (or
`--dir`): date-time submissions a few seconds apart, 1 to 64 GPUs, about 10% CPU-only jobs, 5%
cancelled before they started and 1% of zero seconds, states as Slurm writes them (with
`--format philly-log`, a Philly `cluster_job_log` of as many jobs instead: 1 to 3 attempts of
1 to 16 GPUs, 5% killed in the queue). Then, in a
fresh process (so peak RSS is the reader's own, imports included), `load_trace` reads it (the
streaming check pass); with `--iterate` the same process also builds every JobSpec once more
through `Trace.iter_jobs()` (what a simulation pulls) and drops each. Prints rows/s of each
pass, the jobs and skip counts, and the process's peak RSS; `--json` prints one JSON object.

The target (issue 21): 1,000,000 rows in under 20 s and under 1 GiB.

    .venv/bin/python bench/trace_read.py                      # 1M rows, load only
    .venv/bin/python bench/trace_read.py --rows 200000 --iterate
    .venv/bin/python bench/trace_read.py --filter "gpus>=8 state=COMPLETED"
    .venv/bin/python bench/trace_read.py --format philly-log --rows 117000 --iterate
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

COLUMNS = ("job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state", "submit_time",
           "start_time", "end_time", "duration", "queue")
GPU_CHOICES = (1, 1, 1, 1, 2, 2, 4, 8, 8, 16, 32, 64)
STATES = ("COMPLETED", "COMPLETED", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
TARGET_S = 20.0
TARGET_RSS_MB = 1024.0

CHILD = r"""
import json, resource, sys, time
from traces import load_trace
path, flt, iterate = sys.argv[1], sys.argv[2] or None, sys.argv[3] == "1"
start = time.perf_counter()
trace = load_trace(path, trace_filter=flt)
load_s = time.perf_counter() - start
out = {"load_s": load_s, "jobs": trace.job_count, "skipped": dict(trace.skipped),
       "restarts": trace.restarts,
       "filtered_out": trace.filtered_out, "load_rss_mb":
       resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
if iterate:
    start = time.perf_counter()
    count = sum(1 for _ in trace.iter_jobs())
    out["iterate_s"] = time.perf_counter() - start
    assert count == trace.job_count, (count, trace.job_count)
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def write_log(path: Path, rows: int, seed: int = 0) -> None:
    """`rows` jobs in Helios' cluster_log.csv layout, submissions in time order."""
    rng = random.Random(seed)
    t = datetime(2020, 4, 1)
    fmt = "%Y-%m-%d %H:%M:%S"
    with path.open("w", newline="") as f:
        f.write(",".join(COLUMNS) + "\n")
        for i in range(rows):
            t += timedelta(seconds=rng.randint(0, 6))
            roll = rng.random()
            gpus = 0 if roll < 0.10 else rng.choice(GPU_CHOICES)
            queue = rng.randint(0, 600)
            if 0.10 <= roll < 0.15:  # cancelled while queued: no start, no end
                state, start, end, duration = "CANCELLED", "", "", ""
            else:
                seconds = 0 if roll > 0.99 else rng.randint(1, 86400)
                begun = t + timedelta(seconds=queue)
                state = rng.choice(STATES)
                start, end = begun.strftime(fmt), (begun + timedelta(seconds=seconds)).strftime(fmt)
                duration = str(seconds)
            f.write(f"{i:x}j,u{rng.randint(0, 999)},vc{rng.randint(0, 39)},{gpus},"
                    f"{4 * max(gpus, 1)},"
                    f"{max(1, gpus // 8)},{state},{t.strftime(fmt)},{start},{end},{duration},"
                    f"{queue}\n")


def write_philly_log(path: Path, jobs: int, seed: int = 0) -> None:
    """`jobs` jobs in Philly's cluster_job_log layout (one JSON list), in submission order."""
    rng = random.Random(seed)
    t = datetime(2017, 10, 3)
    fmt = "%Y-%m-%d %H:%M:%S"
    with path.open("w") as f:
        f.write("[")
        for i in range(jobs):
            t += timedelta(seconds=rng.randint(0, 120))
            gpus = rng.choice((1, 1, 2, 4, 8, 8, 16))
            begun = t + timedelta(seconds=rng.randint(0, 600))
            attempts = []
            for _ in range(0 if rng.random() < 0.05 else rng.choice((1, 1, 1, 2, 3))):
                ended = begun + timedelta(seconds=rng.randint(1, 36000))
                machines = max(1, gpus // 8)
                attempts.append({"start_time": begun.strftime(fmt), "end_time": ended.strftime(fmt),
                                 "detail": [{"ip": f"m{rng.randint(0, 551)}",
                                             "gpus": [f"gpu{g}" for g in range(gpus // machines)]}
                                            for _ in range(machines)]})
                begun = ended + timedelta(seconds=rng.randint(1, 60))
            job = {"status": rng.choice(("Pass", "Pass", "Killed", "Failed")),
                   "vc": f"vc{rng.randint(0, 13)}", "jobid": f"application_1506638472019_{i}",
                   "attempts": attempts, "submitted_time": t.strftime(fmt),
                   "user": f"u{rng.randint(0, 300)}"}
            f.write(("," if i else "") + "\n" + json.dumps(job))
        f.write("\n]\n")


def measure(path: Path, trace_filter: str | None, iterate: bool) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), trace_filter or "",
                          "1" if iterate else "0"], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows (jobs) to generate")
    ap.add_argument("--format", choices=("helios", "philly-log"), default="helios")
    ap.add_argument("--dir", type=Path, help="write the log here and keep it (default: a "
                                             "temporary folder, removed afterwards)")
    ap.add_argument("--filter", help="a --trace-filter expression to read with")
    ap.add_argument("--iterate", action="store_true",
                    help="also build every JobSpec once through Trace.iter_jobs()")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.format == "helios":
            path = folder / "cluster_log.csv"
            write_log(path, args.rows)
        else:
            path = folder / "cluster_job_log"
            write_philly_log(path, args.rows)
        file_mb = path.stat().st_size / 1e6
        result = measure(path, args.filter, args.iterate)
    result.update(format=args.format, rows=args.rows, file_mb=round(file_mb, 1),
                  machine=f"{platform.node()}, {os.cpu_count()} CPUs, "
                          f"Python {platform.python_version()}")
    rows = args.rows
    load_s = float(result["load_s"])
    peak = float(result["peak_rss_mb"])
    result["load_rows_per_s"] = rows / load_s if load_s else None
    result["meets_target"] = load_s < TARGET_S and peak < TARGET_RSS_MB
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{rows:,} {args.format} records ({file_mb:.0f} MB) on {result['machine']}")
    print(f"load_trace: {load_s:.1f} s ({rows / load_s:,.0f} rows/s), "
          f"{result['jobs']:,} jobs, {result['restarts']:,} restarts, skipped {result['skipped']}, "
          f"filtered out {result['filtered_out']:,}; peak RSS {result['load_rss_mb']:.0f} MB")
    if "iterate_s" in result:
        it = float(result["iterate_s"])
        print(f"iter_jobs: {it:.1f} s ({rows / it:,.0f} rows/s); peak RSS {peak:.0f} MB")
    if args.format == "helios" and rows == 1_000_000:
        verdict = "meets" if result["meets_target"] else "MISSES"
        print(f"{verdict} the target: under {TARGET_S:.0f} s and {TARGET_RSS_MB:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
