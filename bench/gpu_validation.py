"""Real-GPU validation of the node agent (issue 23, part 3): NVML, a live cluster, MPS.

On a machine with NVIDIA GPUs this exercises what only a GPU can prove, each step guarded
(a failure is printed with its traceback and the next step still runs) and bounded by
`--budget-s`:

1. environment: nvidia-smi, the driver, torch and CUDA, NCCL, the MPS control binary;
2. gpu backend: the node agent's own backend (`detect_backend`, as `loom serve nodeagent`
   picks it): discover(), topology(), telemetry() idle and while a real trainer process
   (started with the supervisor's job environment) trains on GPU 0;
3. cluster: an embedded nats-server, the control plane as `loom up` starts it (one
   `loom serve` process per service, from `loom.up.up_commands`) and one node agent on the
   real backend (`loom.serve.serve`, in this process so its trainers' records can be read);
4. families: one short 1-GPU job per workload family, submitted as `loom submit` does;
5. preemption: a job suspended and resumed (`loom suspend|resume`): stop latency, the
   checkpoint's write time and size, restart latency, and that it resumed where it stopped;
6. mps: under `set-policy muri-s`, two jobs with complementary stage times interleaved on one
   GPU: the agent's MPS daemon and each trainer's active-thread percentage, iterations/s alone
   (step 4) and co-located.

It prints a summary table and writes it, with every detail, to OUT/gpu_validation.json
(after each step, so an interrupted run still leaves its figures).

    python3 bench/gpu_validation.py [--out DIR] [--budget-s S]   # on a GPU machine
    python3 bench/gpu_validation.py --fake-gpus 1                # here: FakeBackend, CPU
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python3 bench/gpu_validation.py` from a plain checkout
    sys.path.insert(0, str(REPO))

from bench.gpuval.run import TERMINATION, main_async  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    default_out = os.environ.get("OUT") or "gpu_validation_out"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fake-gpus", type=int, default=None, metavar="N",
                   help="N fake GPUs (FakeBackend) and CPU training: this script's own test")
    p.add_argument("--out", type=Path, default=Path(default_out),
                   help="where gpu_validation.json goes (default $OUT, else %(default)s)")
    p.add_argument("--budget-s", type=float, default=280.0,
                   help="wall-clock budget for all steps; later steps are skipped past it")
    p.add_argument("--iterations", type=int, default=None,
                   help="iterations of a family job (default 1500 on GPUs, 60 with fake ones)")
    args = p.parse_args(argv)
    if args.fake_gpus is not None and args.fake_gpus < 1:
        p.error("--fake-gpus must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from services.runtime.logging import configure
    configure("warning")  # the agent's spawn failures and telemetry warnings, on stderr
    loop = asyncio.new_event_loop()
    task = loop.create_task(main_async(args))

    # SIGTERM (a `timeout` around the run) cancels the steps; teardown and the report follow.
    # One arriving during teardown is only recorded: the report says who was still running.
    def on_sigterm() -> None:
        phase = "teardown" if TERMINATION.tearing_down else "the steps"
        TERMINATION.received.append((time.monotonic(), phase))
        if not TERMINATION.tearing_down:
            task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        return 1
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
