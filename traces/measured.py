"""Measured profiles (`loom profile`'s output folder) in place of a trace's speed constants.

`OUT/throughputs/<workload>.csv` is in ElasticFlow's format (read by `traces.scaling`) and
`OUT/stages.json` holds the stage times per workload and GPU count. `with_measured` gives each
job whose model is a profiled workload, or maps to one (`resnet18` → `cnn`, as the node agent
launches it), the measured speed at every profiled GPU count (`scaling`), its iteration time at
its own count, and the stage times Muri's interleaving needs. A job keeps its GPU count unless
its trace made it elastic (`min_gpus`/`max_gpus`); jobs of unprofiled models keep the trace's
constants. The job's global batch must be the profiled one (or unset, the trainers' 32).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from domain.workloads import FAMILIES, for_trace_model
from schemas.job import JobSpec
from schemas.userinput import loads_unique
from traces.errors import TraceError
from traces.scaling import ScalingTable, read_folder

STAGE_KEYS = ("data_s", "compute_s", "comm_s")
DEFAULT_BATCH = 32  # the node agent's global batch when a job names none


@dataclass(frozen=True)
class MeasuredProfile:
    path: Path
    scaling: ScalingTable
    stages: dict[str, dict[int, tuple[float, float, float]]]  # workload → GPUs → stages

    def workload_of(self, model: str) -> str | None:
        family = model if model in FAMILIES else for_trace_model(model)
        return family if family in self.scaling.curves else None


def load_measured(folder: str | Path) -> MeasuredProfile:
    root = Path(folder)
    tables = root / "throughputs"
    if not tables.is_dir():
        raise TraceError(root, None, None, "not a `loom profile` folder: no throughputs/ in it")
    scaling = read_folder(tables, name=str(root))
    if not scaling.curves:
        raise TraceError(tables, None, None, "no <workload>.csv throughput tables")
    stages: dict[str, dict[int, tuple[float, float, float]]] = {}
    stage_file = root / "stages.json"
    if stage_file.exists():
        try:
            raw = loads_unique(stage_file.read_text())
            for model, per_count in raw["workloads"].items():
                stages[model] = {int(g): tuple(float(row[k]) for k in STAGE_KEYS)  # type: ignore[misc]
                                 for g, row in per_count.items()}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TraceError(stage_file, None, None,
                             f"expected {{'workloads': {{workload: {{GPUs: {{"
                             f"{', '.join(STAGE_KEYS)}}}}}}}}}: {exc!r}") from None
    return MeasuredProfile(root, scaling, stages)


def with_measured(jobs: Iterable[JobSpec], profile: MeasuredProfile) -> tuple[JobSpec, ...]:
    out = []
    for job in jobs:
        workload = profile.workload_of(job.model)
        batches = profile.scaling.curves.get(workload or "", {})
        batch = job.batch_size or DEFAULT_BATCH
        curve = batches.get(batch)
        if workload is None or not curve:
            out.append(job)
            continue
        if job.gpus not in curve:
            raise TraceError(profile.path, None, job.job_id,
                             f"job {job.job_id} asks for {job.gpus} GPUs; {workload} is "
                             f"profiled at {sorted(curve)} (profile with a larger --max-gpus)")
        update: dict[str, object] = {
            "scaling": dict(curve),
            "iteration_time_s": 1.0 / curve[job.gpus],
            "min_gpus": job.min_gpus or job.gpus,
            "max_gpus": job.max_gpus or job.gpus,
        }
        stage = profile.stages.get(workload, {}).get(job.gpus)
        if stage is not None:
            update["stage_times_s"] = stage
        out.append(job.model_copy(update=update))
    return tuple(out)
