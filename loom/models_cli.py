"""`loom models`: the models a job may name, and what Loom knows of their speed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from domain.workloads import FAMILIES, for_trace_model, trace_prefixes
from loom.cli_common import out
from traces.throughputs import load_throughputs


def add_command(sub: Any) -> None:
    p = sub.add_parser("models", help="list the workload families and model names a job may "
                                      "name, with their throughput profiles")
    p.add_argument("--gpus", type=int, default=1, choices=(1, 2, 4, 8),
                   help="profiles at this many GPUs (default 1)")
    p.add_argument("--json", action="store_true", help="print the same as JSON")


def models(gpus: int = 1) -> dict[str, Any]:
    """The families (with the model names that run as each) and the profiled job types
    (Gavel's throughputs: iterations per second alone, per GPU type, at `gpus` GPUs)."""
    table = load_throughputs()
    types = [t for t in table.gpu_types if not t.endswith("_unconsolidated")]
    prefixes = trace_prefixes()
    families = [{"family": name, "description": text,
                 "models": [f"{p}*" for p in prefixes[name]]}
                for name, text in FAMILIES.items()]
    profiles = []
    for job_type in table.job_types:
        rates = {t: table.isolated[t].get((job_type, gpus)) for t in types}
        if all(r is None for r in rates.values()):
            continue
        profiles.append({"job_type": job_type, "family": for_trace_model(job_type),
                         "gpus": gpus, "iterations_per_s": rates})
    return {"families": families, "profiles": profiles, "gpu_types": types,
            "profile_source": table.path.name}


def cmd_models(args: argparse.Namespace) -> int:
    data = models(args.gpus)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    fams = Table(title="Workload families (`loom submit --model`, the trainer runs these)",
                 title_justify="left")
    for col in ("family", "runs models named", "what the trainer trains"):
        fams.add_column(col)
    for f in data["families"]:
        fams.add_row(f["family"], ", ".join(f["models"]), f["description"])
    out.print(fams)
    prof = Table(title=f"Profiled job types ({data['profile_source']}, Gavel's measurements): "
                       f"iterations/s alone at {args.gpus} GPU(s)", title_justify="left")
    prof.add_column("job type")
    prof.add_column("family")
    for t in data["gpu_types"]:
        prof.add_column(t, justify="right")
    for p in data["profiles"]:
        prof.add_row(p["job_type"], p["family"] or "— (simulation only)",
                     *["—" if r is None else f"{r:,.2f}"
                       for r in p["iterations_per_s"].values()])
    out.print(prof)
    out.print("A model name runs as the first family whose prefix it starts with (case "
              "ignored); a job with --command may name any model.", highlight=False)
    return 0


COMMANDS = {"models": cmd_models}
