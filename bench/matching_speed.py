"""Muri grouping speed: maximum-weight matching of N candidate jobs (one round and all rounds).

    .venv/bin/python bench/matching_speed.py            # 250, 500, 1000 candidates
    .venv/bin/python bench/matching_speed.py --n 2000

Stage times are drawn like Muri's traces (seeded); the weight cache is cleared first, so every
figure is a cold start (no weights reused from an earlier cycle).
"""

from __future__ import annotations

import argparse
import random
import time

from policies.muri import matching


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="*", default=[250, 500, 1000])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{'candidates':>10} {'one round s':>12} {'pairs':>6} {'all rounds s':>13} {'groups':>7}")
    for n in args.n:
        rng = random.Random(args.seed)
        stages = {f"j{i}": tuple(round(rng.uniform(0.001, 0.8), 3) for _ in range(3))
                  for i in range(n)}
        jobs = list(stages)
        matching._WEIGHTS.clear()
        t = time.perf_counter()
        pairs = matching.max_weight_pairs([(j,) for j in jobs], stages)
        one = time.perf_counter() - t
        matching._WEIGHTS.clear()
        t = time.perf_counter()
        groups = matching.group_by_matching({1: jobs}, n // 4, stages)  # to groups of four
        full = time.perf_counter() - t
        print(f"{n:>10} {one:>12.3f} {len(pairs):>6} {full:>13.3f} {len(groups[1]):>7}",
              flush=True)


if __name__ == "__main__":
    main()
