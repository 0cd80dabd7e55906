"""Re-record the bundled event logs: `python traces/logs/record.py` (from the repo root).

Each log is a small simulated run of a bundled trace (some cut to their first jobs so the log
stays well under 1 MB); tests/replay replays every one in CI. Re-record only when a change to
the scheduler or placer is meant to change decisions, and say so in the commit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

from loom.eventlog import read_log
from loom.runs import RunSpec
from loom.simulate import run_simulation

HERE = Path(__file__).resolve().parent

# name → (trace, cluster, policy, first N jobs or None, extra RunSpec fields)
LOGS: dict[str, tuple[str, str, str, int | None, dict[str, object]]] = {
    "tiresias-60job": ("tiresias/60_job", "muri/testbed/n1g8", "tiresias", None, {}),
    "srtf-60job-rounds": ("tiresias/60_job", "muri/testbed/n1g8", "srtf", None,
                          {"round_s": 300.0}),
    "muri-s-trace1-first40": ("muri/trace1", "muri/testbed/n2g8", "muri-s", 40, {}),
    "elasticflow-resnet-cifar": ("elasticflow/resnet_cifar", "elasticflow/n1g2",
                                 "elasticflow", None, {}),
    "gavel-mmf-23dbec-r1800": ("gavel/msr/23dbec", "8:8:8", "max-min-fairness-perf", None,
                               {"round_s": 1800.0}),
}


async def record(name: str) -> None:
    trace, cluster, policy, first, extra = LOGS[name]
    spec = RunSpec(trace=trace, cluster=cluster, policy=policy, **extra)  # type: ignore[arg-type]
    cfg = spec.config()
    if first is not None:
        cfg = dataclasses.replace(cfg, jobs=sorted(cfg.jobs, key=lambda j: j.submit_time_s)[:first],
                                  trace_name=f"{cfg.trace_name} (first {first} jobs)")
    path = HERE / f"{name}.eventlog.gz"
    result = await run_simulation(dataclasses.replace(cfg, log=path))
    log = read_log(path)
    print(f"{path.name}: {len(log.records)} messages, {path.stat().st_size:,} bytes, "
          f"{result.summary['finished']}/{result.summary['jobs']} finished, "
          f"digest {result.summary['decision_digest']}")


if __name__ == "__main__":
    for name in sys.argv[1:] or LOGS:
        asyncio.run(record(name))
