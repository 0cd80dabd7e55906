"""Time Gavel's own simulator on a trace, imports excluded (run with Gavel's Python).

    python bench/gavel_driver.py GAVEL_SCHEDULER_DIR TRACE POLICY CLUSTER GPUS_PER_SERVER

Imports Gavel's modules first, then times `Scheduler.simulate` plus reading the trace, so the
figure compares with Loom's `run_simulation` time. Prints one JSON line: wall_s, avg_jct_s
(over the jobs Gavel completed, as Gavel prints it), makespan_s, completed and failed job counts,
and each job's JCT by its line in the trace (null where it failed).
Nothing of Gavel's is changed; its gRPC stub modules must be importable (PYTHONPATH).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time


def main() -> None:
    gavel, trace, policy, cluster, per_server = sys.argv[1:6]
    sys.path.insert(0, gavel)
    os.chdir(gavel)
    import scheduler  # type: ignore[import-not-found]
    import utils  # type: ignore[import-not-found]

    counts = dict(zip(("v100", "p100", "k80"), map(int, cluster.split(":")), strict=True))
    sizes = dict(zip(("v100", "p100", "k80"), map(int, per_server.split(":")), strict=True))
    t0 = time.perf_counter()
    jobs, arrivals = utils.parse_trace(trace)
    sched = scheduler.Scheduler(utils.get_policy(policy, solver="ECOS", seed=0),
                                throughputs_file="simulation_throughputs.json", simulate=True,
                                seed=0, time_per_iteration=360)
    with contextlib.redirect_stdout(io.StringIO()):
        sched.simulate(counts, arrivals, jobs, num_gpus_per_server=sizes)
    wall = time.perf_counter() - t0
    times = sched._job_completion_times  # JobIdPair → JCT, None where the job failed
    done = [v for v in times.values() if v is not None]
    print(json.dumps({"wall_s": wall, "avg_jct_s": sum(done) / len(done),
                      "makespan_s": sched.get_current_timestamp(),
                      "completed": len(done),
                      "failed": len(times) - len(done),
                      # by the job's line in the trace (Gavel numbers jobs as they arrive)
                      "jct_by_line": {str(job_id[0]): v for job_id, v in times.items()}}))
    os._exit(0)  # Gavel's scheduler leaves non-daemon threads behind


if __name__ == "__main__":
    main()
