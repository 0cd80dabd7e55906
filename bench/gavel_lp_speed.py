"""Re-solve time of Gavel's LPs at Gavel's policy-runtime sweep sizes (Fig. 12: 32–2,048 jobs).

    .venv/bin/python bench/gavel_lp_speed.py [--jobs 32,256,2048] [--repeats 5]

Jobs are drawn from Gavel's bundled throughput table (random job type and GPU count, random
remaining work and age) on 36:36:36 GPUs. For each size the first solve (compile included) is
reported apart from the re-solves, which change every number (throughputs, GPU counts,
remaining work) as successive rounds do; the target is a max-min-fairness-perf re-solve for
2,048 jobs under 1 s.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from policies.finish_time_fairness import FinishTimeFairnessSolver
from policies.max_min_fairness import MaxMinLp, max_min_fairness
from policies.mechanisms.allocation import AllocationInput
from policies.mechanisms.lp import FloatArray
from traces.throughputs import load_throughputs

TYPES = ("k80", "p100", "v100")


def random_input(m: int, rng: random.Random) -> AllocationInput:
    table = load_throughputs()
    keys = [k for k in table.isolated["v100"] if all(k in table.isolated[t] for t in TYPES)]
    rows, gpus = [], []
    for _ in range(m):
        job_type, sf = rng.choice(keys)
        rows.append([table.isolated[t][(job_type, sf)] for t in TYPES])
        gpus.append(float(sf))
    return AllocationInput(
        job_ids=tuple(str(i) for i in range(m)), types=TYPES,
        throughputs=np.array(rows), gpus=np.array(gpus), weights=np.ones(m),
        remaining=np.array([rng.uniform(1e3, 1e6) for _ in range(m)]),
        age_s=np.array([rng.uniform(0, 1e5) for _ in range(m)]),
        capacity=np.array([36.0, 36.0, 36.0]), prices=np.ones(3),
        deadline_s=np.full(m, np.inf), now=0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="32,128,512,1024,2048")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import cvxpy  # noqa: F401  - import time is not solve time

    print(f"{'policy':<28} {'jobs':>5} {'first s':>8} {'re-solve s (median)':>20} "
          f"{'max s':>7}")
    for m in (int(x) for x in args.jobs.split(",")):
        rng = random.Random(m)
        inputs = [random_input(m, rng) for _ in range(args.repeats + 1)]
        mmf = MaxMinLp()
        ftf = FinishTimeFairnessSolver()
        solvers = {
            "max-min-fairness-perf": lambda a, lp=mmf: max_min_fairness(lp, a, a.throughputs),
            "finish-time-fairness-perf": lambda a, lp=ftf: lp.solve(a, a.throughputs),
        }
        for name, solve in solvers.items():
            times = []
            for inp in inputs:
                t = time.perf_counter()
                x: FloatArray = solve(inp)
                times.append(time.perf_counter() - t)
                assert x.shape == inp.shape
            again = times[1:]
            print(f"{name:<28} {m:>5} {times[0]:>8.3f} {statistics.median(again):>20.3f} "
                  f"{max(again):>7.3f}", flush=True)


if __name__ == "__main__":
    main()
