"""`loom doctor`: check that this node can run Loom's jobs, before its agent starts.

It runs the checks the node agent runs at start-up (`services.nodeagent.doctor`; each one
documented in docs/doctor.md) through the same GPU backend, MPS control and NATS login the
agent would use, prints a table (or `--json`), and exits with the worst result: 0 when every
check passed, 1 with a warning, 2 with a failure (2 also for arguments it cannot use, with
the message on stderr and no table). `--fake-gpus` with `--fake-faults` (or
`LOOM_FAKE_FAULTS`) runs it on fake GPUs with the failures named (`FakeFaults`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from loom import live_args
from loom.cli_common import out

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def _size(text: str) -> int:
    from services.runtime.stream_limits import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_command(sub: Any) -> None:
    d = sub.add_parser(
        "doctor", help="check this node can run Loom's jobs: driver, GPUs, CUDA, NCCL, MPS, "
                       "checkpoints, NATS, clock (exit 0 pass, 1 warn, 2 fail)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--json", action="store_true",
                   help="print the checks as JSON (for tools) instead of a table")
    d.add_argument("--node", default=socket.gethostname().split(".")[0],
                   help="the node id the agent will run as: names its MPS directories "
                        "(default: this host's name)")
    d.add_argument("--expect-gpus", type=int, metavar="N",
                   help="GPUs the cluster spec gives this node: fewer visible fail "
                        "(default: at least one)")
    d.add_argument("--gpu-backend", choices=("auto", "dcgm", "nvml"), default="auto",
                   help="GPU discovery and telemetry, as the agent's flag (default: DCGM if "
                        "present, else NVML)")
    d.add_argument("--fake-gpus", type=int, metavar="K",
                   help="K fake GPUs instead of NVML/DCGM (machines without GPUs)")
    d.add_argument("--fake-faults", metavar="FAULTS",
                   default=os.environ.get("LOOM_FAKE_FAULTS", ""),
                   help="with --fake-gpus: failures to pretend, comma-separated, e.g. "
                        "ecc_uncorrectable=1,xid=1:79,no_dcgm,mps,nats,skew=30 "
                        "(docs/doctor.md lists them; default $LOOM_FAKE_FAULTS)")
    d.add_argument("--checkpoint-root", type=Path, default=Path("/var/lib/loom/checkpoints"),
                   help="the trainers' checkpoint directory, as the agent's flag; MPS uses "
                        "<its parent>/mps/<node> (default /var/lib/loom/checkpoints)")
    d.add_argument("--min-free", type=_size, default=1 << 30, metavar="SIZE",
                   help="free space under the checkpoint root below which it fails (warns "
                        "below 10 times it; default 1G)")
    d.add_argument("--trainers", choices=("pytorch", "simulated"), default="pytorch",
                   help="what the agent will run: simulated trainers need no torch, gloo or "
                        "NCCL (default pytorch)")
    d.add_argument("--no-nats", action="store_true",
                   help="skip the NATS and clock checks (no server to reach yet)")
    d.add_argument("--log-level", default="warning", help="log level (default warning)")
    live_args.add_connection(d, default=live_args.default_url())


def cmd_doctor(args: argparse.Namespace) -> int:
    # The services load only when the command runs (`loom --help` stays quick).
    from services.nodeagent.doctor import Doctor, DoctorConfig, exit_status, worst
    from services.nodeagent.gpu import (
        FakeBackend,
        FakeFaults,
        GpuBackend,
        GpuBackendError,
        MpsControl,
        detect_backend,
        run_command,
    )
    from services.nodeagent.probes import RealHost, host_for
    from services.runtime.nats_auth import NatsAuth

    faults = FakeFaults.parse(args.fake_faults)
    if args.fake_faults and args.fake_gpus is None:
        raise ValueError("--fake-faults needs --fake-gpus (faults are pretended by fake GPUs)")
    if args.fake_gpus is not None and args.fake_gpus < 0:
        raise ValueError(f"--fake-gpus must be ≥ 0, not {args.fake_gpus}")
    backend: GpuBackend | None = None
    error = None
    if args.fake_gpus is not None:
        fake = FakeBackend(args.fake_gpus, node=args.node, faults=faults)
        backend = fake
    else:
        try:
            backend = detect_backend(args.gpu_backend)
        except GpuBackendError as exc:
            error = str(exc)
    runner = backend.run if isinstance(backend, FakeBackend) else run_command
    mps_dir = args.checkpoint_root.parent / "mps" / args.node
    mps = MpsControl(mps_dir / "pipe", mps_dir / "log", run=runner)
    real = RealHost(sys.executable,
                    nats_url=None if args.no_nats else args.nats_url,
                    auth=None if args.no_nats else NatsAuth.from_args(args))
    config = DoctorConfig(checkpoint_root=args.checkpoint_root, expect_gpus=args.expect_gpus,
                          min_free_bytes=args.min_free, low_free_bytes=10 * args.min_free,
                          trainers=args.trainers == "pytorch")
    doctor = Doctor(backend, host_for(backend, real), mps, config, backend_error=error)
    try:
        checks = asyncio.run(doctor.run())
    finally:
        if backend is not None:
            backend.close()
    status = exit_status(checks)
    if args.json:
        sys.stdout.write(json.dumps({
            "node": args.node, "worst": worst(checks), "exit_status": status,
            "checks": [c.to_dict() for c in checks]}, indent=2) + "\n")
        return status
    table = Table(title=f"loom doctor: {args.node}", title_justify="left")
    for col in ("check", "GPU", "status", "measured", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.name, "" if c.gpu is None else str(c.gpu),
                      Text(c.status, style=STYLE[c.status]), Text(c.measured), Text(c.fix))
    out.print(table)
    counts = {s: sum(c.status == s for c in checks) for s in STYLE}
    out.print(Text(f"{worst(checks)}: " + ", ".join(f"{n} {s}" for s, n in counts.items()
                                                     if n) + f" (exit status {status})",
                   style=STYLE[worst(checks)]))
    return status


COMMANDS = {"doctor": cmd_doctor}
