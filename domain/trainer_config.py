"""Command-line arguments → a validated, frozen `TrainerConfig` (no torch import).

`parse(argv)` raises `ConfigError` with a message naming the flag; argparse itself exits 2 on
unknown flags, bad numbers and unknown choices. The node agent builds the command line with
`TrainerConfig.to_argv()`.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from domain.workloads import FAMILIES
from schemas.job import JobId

Backend = Literal["auto", "gloo", "nccl", "horovod"]
Device = Literal["auto", "cpu", "cuda"]

# How long a rank waits for the others at the rendezvous, and in any collective.
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0


class ConfigError(ValueError):
    """The arguments can never give a working launch."""


class TrainerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: JobId
    model: str
    iterations: int = Field(ge=1)  # the job's total; a resumed launch runs the remainder
    batch_size: int = Field(ge=1)  # global batch, split evenly across ranks
    checkpoint_dir: str = Field(min_length=1)
    rank: int = Field(default=0, ge=0)
    world_size: int = Field(default=1, ge=1)
    master_addr: str = "127.0.0.1"
    master_port: int = Field(default=29500, ge=1, le=65535)
    backend: Backend = "auto"
    device: Device = "auto"
    seed: int = Field(default=0, ge=0, lt=2**63)
    fast_forward: int = Field(default=0, ge=0)  # real iterations measured per launch; 0 = off
    warmup: int = Field(default=2, ge=0)  # iterations per launch left out of stage timing
    report: str = "stdout"  # stdout | fd:N | file:PATH
    report_every: int = Field(default=0, ge=0)  # progress every N iterations (0 = off)
    report_interval: float = Field(default=2.0, ge=0)  # ... and at least every S seconds
    checkpoint_every: int = Field(default=0, ge=0)  # periodic checkpoints (0 = off)
    threads: int = Field(default=1, ge=1)  # torch intra-op CPU threads per rank
    rendezvous_timeout: float = Field(default=DEFAULT_RENDEZVOUS_TIMEOUT_S, gt=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    data: str | None = None  # a real dataset (services/trainer/datasets.py); None: synthetic

    @model_validator(mode="after")
    def _consistent(self) -> TrainerConfig:
        if self.model not in FAMILIES:
            raise ValueError(f"--model {self.model!r}: choose one of {', '.join(FAMILIES)}")
        if self.rank >= self.world_size:
            raise ValueError(
                f"--rank {self.rank} must be below --world-size {self.world_size}"
            )
        if self.batch_size % self.world_size:
            raise ValueError(
                f"--batch-size {self.batch_size} (the global batch) must be divisible by "
                f"--world-size {self.world_size}"
            )
        if not (self.report == "stdout" or self.report.startswith(("fd:", "file:"))):
            raise ValueError(f"--report {self.report!r}: use stdout, fd:N or file:PATH")
        if self.report.startswith("fd:") and not self.report[3:].isdigit():
            raise ValueError(f"--report {self.report!r}: fd:N needs a file-descriptor number")
        if self.report.startswith("file:") and not self.report[5:]:
            raise ValueError("--report file:PATH needs a path")
        if self.report_every == 0 and self.report_interval == 0:
            raise ValueError("--report-every and --report-interval cannot both be 0")
        if self.data is not None and not Path(self.data).exists():
            raise ValueError(f"--data {self.data}: no such file or directory")
        if self.backend == "nccl" and self.device == "cpu":
            raise ValueError("--backend nccl needs --device cuda (or auto on a GPU node)")
        if self.backend == "horovod" and importlib.util.find_spec("horovod") is None:
            raise ValueError(
                "--backend horovod: horovod is not installed (it is optional: build it with "
                "torch present, see ecosystem notes; or use --backend gloo/nccl)"
            )
        return self

    def to_argv(self) -> list[str]:
        """The command line that parses back to this config (for the node agent)."""
        argv: list[str] = []
        for name, value in self.model_dump().items():
            if value is None:
                continue  # an optional flag left out
            argv += [f"--{name.replace('_', '-')}", str(value)]
        return argv


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.trainer",
        description="Run one rank of a Loom training job and report progress as JSON lines.",
    )
    req = p.add_argument_group("job (required)")
    req.add_argument("--job-id", required=True)
    req.add_argument("--model", required=True, choices=sorted(FAMILIES),
                     help="workload family: " + "; ".join(f"{k}: {v}" for k, v in FAMILIES.items()))
    req.add_argument("--iterations", required=True, type=int,
                     help="the job's total iterations; a resumed launch runs the remainder")
    req.add_argument("--checkpoint-dir", required=True,
                     help="rank 0 reads/writes DIR/checkpoint.pt here")
    p.add_argument("--batch-size", type=int, default=32,
                   help="global batch size, split evenly across ranks (default 32)")
    dist = p.add_argument_group("placement")
    dist.add_argument("--rank", type=int, default=0)
    dist.add_argument("--world-size", type=int, default=1)
    dist.add_argument("--master-addr", default="127.0.0.1", help="rank 0's host")
    dist.add_argument("--master-port", type=int, default=29500)
    dist.add_argument("--backend", choices=["auto", "gloo", "nccl", "horovod"], default="auto",
                      help="auto: nccl on cuda, else gloo; world size 1 opens no process group")
    dist.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                      help="auto: cuda:0 of CUDA_VISIBLE_DEVICES if there is one, else cpu")
    dist.add_argument("--rendezvous-timeout", type=float, default=DEFAULT_RENDEZVOUS_TIMEOUT_S,
                      help="seconds to wait for peers, also per collective "
                           f"(default {DEFAULT_RENDEZVOUS_TIMEOUT_S:g})")
    run = p.add_argument_group("run")
    run.add_argument("--data", metavar="PATH",
                     help="train on a real dataset: CIFAR-10 binary batches or an image folder "
                          "(cnn), WikiText raw text (transformer); default synthetic data")
    run.add_argument("--seed", type=int, default=0,
                     help="initial weights and the synthetic data stream (default 0)")
    run.add_argument("--fast-forward", type=int, default=0, metavar="K",
                     help="after K measured iterations per launch, stop computing and advance "
                          "the iteration count at the measured rate (Muri/ElasticFlow testbeds)")
    run.add_argument("--warmup", type=int, default=2,
                     help="iterations per launch excluded from stage timing (default 2)")
    run.add_argument("--checkpoint-every", type=int, default=0, metavar="N")
    run.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    rep = p.add_argument_group("reporting")
    rep.add_argument("--report", default="stdout", help="stdout | fd:N | file:PATH")
    rep.add_argument("--report-every", type=int, default=0, metavar="N",
                     help="a progress record every N iterations (default off)")
    rep.add_argument("--report-interval", type=float, default=2.0, metavar="S",
                     help="... and at least every S seconds (default 2)")
    rep.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                     default="info", help="structlog JSON lines on stderr")
    return p


def parse(argv: list[str] | None = None) -> TrainerConfig:
    """Parse and validate; `ConfigError` says which flag is wrong. argparse exits 2 itself."""
    return from_namespace(build_parser().parse_args(argv))


def from_namespace(ns: argparse.Namespace) -> TrainerConfig:
    try:
        return TrainerConfig(**vars(ns))
    except ValidationError as exc:
        raise ConfigError(_explain(exc)) from None


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"--{loc.replace('_', '-')}: {msg}" if loc else msg)
    return "; ".join(parts)


def usable_report(spec: str) -> str:
    """`spec` when it is a well-formed report channel, else "stdout" (for reporting an error)."""
    if spec.startswith("fd:") and spec[3:].isdigit():
        return spec
    if spec.startswith("file:") and spec[5:]:
        return spec
    return "stdout"
