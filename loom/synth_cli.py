"""`loom sweep` and `loom gen-trace`: synthetic traces, drawn as Gavel's or ElasticFlow's
generators draw them, and Gavel's JCT-against-load sweep over them."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from loom.cli_common import err, out, positive, slug
from loom.plots import jct_vs_load
from loom.report import sweep_table
from loom.sweep import Sweep, curves, run_sweep, write_csv, write_json
from traces import load_throughputs
from traces.elasticflow_generator import generate_elasticflow_jobs, write_elasticflow_trace
from traces.gavel_generator import DISTRIBUTIONS, generate_gavel_jobs, write_gavel_trace

_T = TypeVar("_T")


def _add_gavel_job_options(p: argparse.ArgumentParser, distribution: str) -> None:
    p.add_argument("--multi-gpu", action="store_true",
                   help="draw multi-GPU jobs as Gavel's -m does (default: 1 GPU each)")
    p.add_argument("--multi-priority", action="store_true",
                   help="give 20%% of the jobs priority weight 5, as Gavel does")
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default=distribution,
                   help="trace: Gavel's generate_trace.py; philly: the jobs Gavel's simulator "
                        f"generates itself (default {distribution})")
    p.add_argument("--throughputs", help="per-GPU-type throughput JSON "
                                         "(default: Gavel's bundled simulation table)")


def add_commands(sub: Any) -> None:
    sweep = sub.add_parser(
        "sweep", help="avg JCT against input job rate on synthetic Gavel traces",
        description="Policies × input job rates × seeds on traces drawn as Gavel draws them, "
                    "in parallel; measures the average JCT of a window of job IDs (Gavel's "
                    "steady-state method) and writes sweep.csv, sweep.json, jct_vs_load.png.")
    sweep.add_argument("--policies", required=True, help="comma-separated, e.g. fifo-perf,"
                                                         "max-min-fairness-perf")
    sweep.add_argument("--rates", required=True,
                       help="input job rates in jobs per hour, comma-separated (Poisson "
                            "arrivals, mean gap 3600/rate s)")
    sweep.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    sweep.add_argument("--cluster", required=True,
                       help="GPU counts per type V100:P100:K80 (36:36:36), a bundled name or a "
                            "cluster-spec file")
    sweep.add_argument("--gpus-per-server", default="4",
                       help="with GPU counts: GPUs per server, N or N:N:N per type (default 4)")
    sweep.add_argument("--jobs", type=int, default=1000, help="jobs per trace (default 1000)")
    sweep.add_argument("--window", help="START:END, the job IDs measured (0-based, END "
                                        "excluded; default: the middle third of --jobs)")
    _add_gavel_job_options(sweep, "philly")
    sweep.add_argument("--round-s", type=positive,
                       help="re-plan every S seconds (default: the policy's own; 360 s rounds "
                            "for Gavel's policies)")
    sweep.add_argument("--processes", type=int, default=0,
                       help="parallel processes (default: up to the CPU count)")
    sweep.add_argument("--run-to-completion", action="store_true",
                       help="run every job to the end (default: stop once the window's jobs "
                            "have finished, as Gavel does)")
    sweep.add_argument("--save-traces", action="store_true",
                       help="keep each trace as OUT/traces/rate<R>-seed<S>.trace (Gavel format)")
    sweep.add_argument("--out", type=Path, help="output directory (default runs/sweep-<cluster>)")
    sweep.add_argument("--log-level", default="warning", help="service log level (default warning)")

    gen = sub.add_parser("gen-trace", help="write a synthetic trace as Gavel's or "
                                           "ElasticFlow's generator draws it")
    gen.add_argument("generator", choices=("gavel", "elasticflow"),
                     help="gavel: traces.gavel_generator, Gavel's 10-field format; elasticflow: "
                          "traces.elasticflow_generator, ElasticFlow's deadline CSV")
    gen.add_argument("--jobs", type=int, required=True, help="number of jobs")
    arrivals = gen.add_mutually_exclusive_group(required=True)
    arrivals.add_argument("--lam", help="mean inter-arrival time in seconds (0: all at t=0)")
    arrivals.add_argument("--rate", help="input job rate in jobs per hour (lam = 3600 / rate)")
    gen.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    _add_gavel_job_options(gen, "trace")
    gen.set_defaults(distribution=None)  # None: not given, so elasticflow can refuse it
    ef = gen.add_argument_group("elasticflow only (always multi-GPU, as the artifact)")
    ef.add_argument("--gpu-type", choices=("A100", "T4"),
                    help="ElasticFlow throughput table for the iterations (default A100)")
    ef.add_argument("--min-ddl", help="deadline factor U(min, max) × duration (default 0.5)")
    ef.add_argument("--max-ddl", help="(default 1.5)")
    ef.add_argument("--best-effort", help="share of best-effort jobs, 0 to 1 (default 0)")
    ef.add_argument("--max-gpus", type=int, help="most GPUs for a job (default 16)")
    gen.add_argument("--out", type=Path, required=True, help="trace file to write")


def _number(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag}: {text.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag}: {text.strip()!r} is not a finite number")
    return value


def _rate(flag: str, text: str) -> float:
    value = _number(flag, text)
    if value <= 0:
        raise ValueError(f"{flag}: {text.strip()!r} must be a positive number of jobs per hour")
    return value


def _integer(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag}: {text.strip()!r} is not an integer") from None


def _items(flag: str, text: str, convert: Callable[[str, str], _T]) -> tuple[_T, ...]:
    """A comma-separated option: every item converted, none empty, none twice."""
    items = tuple(convert(flag, part) for part in text.split(","))  # "" fails to convert
    if len(set(items)) != len(items):
        raise ValueError(f"{flag} lists a value twice: {text}")
    return items


def _name(_: str, text: str) -> str:
    if not text.strip():
        raise ValueError("--policies has an empty name")
    return text.strip()


def _window(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    if not sep:
        raise ValueError(f"--window: expected START:END job IDs, got {text!r}")
    return _integer("--window", start), _integer("--window", end)


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.processes < 0:
        raise ValueError(f"--processes must be 0 (one per CPU) or more, got {args.processes}")
    sweep = Sweep(
        policies=_items("--policies", args.policies, _name),
        rates=_items("--rates", args.rates, _rate),
        seeds=_items("--seeds", args.seeds, _integer),
        cluster=args.cluster, jobs=args.jobs, window=_window(args.window),
        gpus_per_server=args.gpus_per_server, throughputs=args.throughputs,
        distribution=args.distribution, multi_gpu=args.multi_gpu,
        multi_priority=args.multi_priority, round_s=args.round_s, log_level=args.log_level,
        run_to_completion=args.run_to_completion,
    )
    sweep.validate()
    dest = args.out or Path("runs") / f"sweep-{slug(Path(args.cluster).name).replace(':', '-')}"
    rows = run_sweep(sweep, args.processes, dest / "traces" if args.save_traces else None)
    dest.mkdir(parents=True, exist_ok=True)
    write_csv(rows, dest / "sweep.csv")
    write_json(rows, sweep, args.invocation, dest / "sweep.json")
    start, end = sweep.job_window
    seeds = ",".join(str(s) for s in sweep.seeds)
    title = (f"{args.cluster}, {sweep.distribution} jobs: window {start}..{end - 1} of "
             f"{sweep.jobs}, seed{'s' if len(sweep.seeds) > 1 else ''} {seeds}")
    jct = curves(rows)
    jct_vs_load({p: {r: [v for v in vs if v is not None] for r, vs in by_rate.items()}
                 for p, by_rate in jct.items()}, dest / "jct_vs_load.png", title)
    out.print(sweep_table(jct, title))
    for r in rows:
        if r.errors or r.window_unfinished:
            err.print(f"[yellow]warning:[/yellow] {r.policy} at {r.rate_jobs_per_h:g} jobs/h, "
                      f"seed {r.seed}: {r.window_unfinished} window jobs unfinished, "
                      f"{r.errors} errors", highlight=False)
    out.print(f"wrote {dest}/sweep.csv, sweep.json and jct_vs_load.png"
              + (f", traces in {dest}/traces/" if args.save_traces else ""))
    return 0 if all(not r.errors and not r.window_unfinished for r in rows) else 1


def cmd_gen_trace(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    if args.rate is not None:
        lam = 3600.0 / _rate("--rate", args.rate)
    else:
        lam = _number("--lam", args.lam)
        if lam < 0:
            raise ValueError(f"--lam: {args.lam!r} must be 0 or more seconds")
    if args.generator == "elasticflow":
        return _gen_elasticflow(args, lam)
    for flag in ("gpu_type", "min_ddl", "max_ddl", "best_effort", "max_gpus"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} applies to elasticflow traces only")
    try:
        jobs = generate_gavel_jobs(
            args.jobs, lam, args.seed, multi_gpu=args.multi_gpu,
            multi_priority=args.multi_priority, distribution=args.distribution or "trace",
            throughputs=load_throughputs(args.throughputs) if args.throughputs else None,
        )
    except KeyError as exc:  # a job type the profile lacks
        raise ValueError(f"--throughputs: {exc.args[0]}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_gavel_trace(jobs, args.out)
    out.print(f"wrote {args.out}: {len(jobs)} jobs, mean gap {lam:g} s, Gavel's 10-field format")
    return 0


def _gen_elasticflow(args: argparse.Namespace, lam: float) -> int:
    for flag in ("distribution", "throughputs"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag} applies to gavel traces only")
    min_ddl = 0.5 if args.min_ddl is None else _number("--min-ddl", args.min_ddl)
    max_ddl = 1.5 if args.max_ddl is None else _number("--max-ddl", args.max_ddl)
    if not 0 <= min_ddl <= max_ddl:
        raise ValueError(f"--min-ddl, --max-ddl: need 0 <= {min_ddl:g} <= {max_ddl:g}")
    share = 0.0 if args.best_effort is None else _number("--best-effort", args.best_effort)
    if not 0 <= share <= 1:
        raise ValueError(f"--best-effort: {args.best_effort!r} must be between 0 and 1")
    max_gpus = 16 if args.max_gpus is None else args.max_gpus
    if max_gpus < 1:
        raise ValueError(f"--max-gpus: {max_gpus} must be at least 1")
    gpu_type = args.gpu_type or "A100"
    try:
        jobs = generate_elasticflow_jobs(
            args.jobs, lam, args.seed, gpu_type=gpu_type, max_scale_factor=max_gpus,
            min_ddl=min_ddl, max_ddl=max_ddl, best_effort_percentage=share,
            multi_priority=args.multi_priority,
        )
    except ValueError as exc:  # a template the throughput table lacks (every one for T4)
        raise ValueError(f"--gpu-type {gpu_type}: {exc}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_elasticflow_trace(jobs, args.out)
    out.print(f"wrote {args.out}: {len(jobs)} jobs, mean gap {lam:g} s, ElasticFlow's CSV format")
    return 0


COMMANDS = {"sweep": cmd_sweep, "gen-trace": cmd_gen_trace}
