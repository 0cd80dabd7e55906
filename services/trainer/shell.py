"""The trainer process: arguments, the report channel, signals, the process group, exit codes.

Exit codes: 0 finished or stopped (checkpoint written), 1 runtime failure (a peer died, the
rendezvous timed out, ...), 2 the launch can never work (invalid arguments, incompatible
checkpoint, unavailable backend or device). Each failure also writes a `failed` record.

SIGTERM/SIGINT before the `started` record keep their default action: nothing has been trained
since the last checkpoint, so dying at once loses nothing (and a rank blocked in the rendezvous
could not run a Python handler anyway). After `started`, they set a flag: the current step
finishes, every rank stops after the same iteration, rank 0 writes the checkpoint atomically,
and each rank writes `stopped` and exits 0.
"""

from __future__ import annotations

import sys
import time

import structlog

from domain import trainer_config as config
from schemas.trainer import Failed
from services.runtime.logging import configure, get_logger
from services.trainer.channel import Reporter
from services.trainer.errors import PERMANENT, TrainingFailed
from services.trainer.stopping import SignalStop


def main(argv: list[str] | None = None, *, protect_stdout: bool = False) -> int:
    t_main = time.perf_counter()
    ns = config.build_parser().parse_args(argv)  # exits 2 with usage on malformed flags
    try:
        cfg = config.from_namespace(ns)
    except config.ConfigError as exc:
        sys.stderr.write(f"python -m services.trainer: error: {exc}\n")
        try:
            reporter = Reporter(config.usable_report(ns.report))
        except OSError:
            reporter = Reporter("stdout")
        reporter.emit(_failed(ns.job_id, max(0, ns.rank), f"invalid arguments: {exc}",
                              "invalid_arguments", 2))
        reporter.close()
        return 2
    try:
        reporter = Reporter(cfg.report, protect_stdout=protect_stdout)
    except OSError as exc:
        sys.stderr.write(f"python -m services.trainer: error: --report {cfg.report}: {exc}\n")
        return 2
    configure(cfg.log_level, json=True)
    structlog.contextvars.bind_contextvars(job_id=cfg.job_id, rank=cfg.rank)
    log = get_logger("services.trainer")
    try:
        return _run(cfg, reporter, t_main)
    except Exception as exc:
        iteration = exc.iteration if isinstance(exc, TrainingFailed) else None
        cause = exc.cause if isinstance(exc, TrainingFailed) else exc
        code = 2 if isinstance(cause, PERMANENT) else 1
        log.error("failed", error=type(cause).__name__, reason=str(cause), iteration=iteration,
                  exc_info=code == 1)
        reporter.emit(_failed(cfg.job_id, cfg.rank, str(cause) or type(cause).__name__,
                              type(cause).__name__, code, iteration))
        return code
    finally:
        reporter.close()


def _run(cfg: config.TrainerConfig, reporter: Reporter, t_main: float) -> int:
    import torch  # heavy: imported once the arguments are valid

    from services.trainer import comm
    from services.trainer.runner import Trainer

    torch.set_num_threads(cfg.threads)
    device = comm.resolve_device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = comm.resolve_backend(cfg.backend, device)
    communicator = comm.connect(
        backend, master_addr=cfg.master_addr, master_port=cfg.master_port, rank=cfg.rank,
        world_size=cfg.world_size, timeout_s=cfg.rendezvous_timeout,
    )
    try:
        Trainer(cfg, communicator, device, reporter.emit, SignalStop(), t_main).run()
    finally:
        communicator.close()
    return 0


def _failed(job_id: str, rank: int, reason: str, error: str, code: int,
            iteration: int | None = None) -> Failed:
    return Failed(job_id=job_id, rank=rank, ts=time.time(), reason=reason, error=error,
                  exit_code=code, iteration=iteration)

