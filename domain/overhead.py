"""What preemption, restart and re-planning cost a job, as explicit, named models.

The research simulators disagree, and the choice changes results (algorithms.md §10):
- `muri`: every running job loses a per-model constant at every scheduling event (Muri's
  `overhead_dict`, 10 s for unknown models), and iterations run 1.5 % slower than the trace
  says (Muri's calibration factor 1.015);
- `elasticflow`: 2 s at every event, plus a restart of (log2 g + 1) × 2 s + 27 s whenever a job
  (re)starts on new GPUs (ElasticFlow's `estimate_overhead`, simplified);
- `elasticflow-baseline`: (log2 g + 1) × 2 s + 2 s whenever a job (re)starts, nothing per
  event: how ElasticFlow's artifact charges the baselines it compares against (dlas-gpu,
  themis: `estimate_overhead` at a start, with the executor cache's 27 s restart only at
  every 60th scheduling event, which this model leaves out);
- `flat:S`: S seconds each time a job (re)starts (Pollux/Sia use 30 s);
- `none`: nothing (Gavel's and Blox's simulators);
- `profile:FILE`: what `loom profile` measured on the real trainers (`overheads.json`): a
  (re)started job of a profiled workload loses its measured restart time at that GPU count
  (the nearest profiled count below, else above); nothing per event. A model the file does not
  cover loses the largest restart time in the file, so an unprofiled job is never free.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from domain.goodput import job_batch, model_for
from domain.interleave import group_iteration_time
from domain.progress import Segments
from domain.workloads import FAMILIES, for_trace_model
from schemas.events import GpuSlots
from schemas.job import JobSpec
from schemas.throughputs import ThroughputTable
from schemas.userinput import DuplicateKeyError, loads_unique

OVERHEADS_FORMAT = "loom.overheads.v1"  # `loom profile`'s overheads.json

# Muri run_sim.py: measured start overhead in seconds, by GPU count and model.
_MURI_OVERHEAD: dict[int, dict[str, float]] = {
    1: {"vgg16": 7, "vgg19": 7, "resnet18": 4, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10,
        "a2c": 38, "dqn": 5},
    2: {"vgg16": 7, "vgg19": 7, "resnet18": 5, "shufflenet_v2_x1_0": 4, "bert": 10, "gpt2": 10,
        "a2c": 39, "dqn": 5},
    4: {"vgg16": 8, "vgg19": 8, "resnet18": 5, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10,
        "a2c": 39, "dqn": 6},
    8: {"vgg16": 9, "vgg19": 9, "resnet18": 7, "shufflenet_v2_x1_0": 5, "bert": 10, "gpt2": 10,
        "a2c": 46, "dqn": 6},
    16: {"vgg16": 9, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 7, "bert": 10,
         "gpt2": 10, "a2c": 46, "dqn": 8},
    32: {"vgg16": 10, "vgg19": 10, "resnet18": 7, "shufflenet_v2_x1_0": 8, "bert": 10,
         "gpt2": 10, "a2c": 46, "dqn": 8},
}
_MURI_DEFAULT = 10.0
MURI_SLOWDOWN = 1.015  # Muri's calibration of every job's solo iteration time


@dataclass(frozen=True)
class OverheadModel:
    """`per_event(spec)`: seconds lost by a running job when a cycle interrupts it;
    `restart(spec)`: seconds before a (re)started job makes progress; `slowdown`: factor on
    the trace's iteration time."""

    name: str
    kind: str
    flat_s: float = 0.0
    # kind "profile": workload → GPU count → measured restart seconds
    measured: Mapping[str, Mapping[int, float]] = field(default_factory=dict, compare=False)

    def iteration_time(self, spec: JobSpec, gpu_type: str | None = None,
                       gpus: int | None = None) -> float:
        """Seconds per iteration with `gpus` GPUs (default: as requested) of `gpu_type`."""
        base = spec.iteration_time_at(gpus or spec.gpus, gpu_type)
        if self.kind == "muri":
            # Muri's arithmetic exactly (ms × 1.015 / 1000): a last-bit difference in a finish
            # time can reorder two events and change a later decision.
            return base * 1000.0 * MURI_SLOWDOWN / 1000.0
        return base

    @property
    def charges_per_event(self) -> bool:
        """Whether a scheduling cycle costs running jobs time (`per_event` can be > 0)."""
        return self.kind in ("muri", "elasticflow")

    @property
    def charges_restart(self) -> bool:
        """Whether a (re)start can cost time (`restart` can be > 0)."""
        return self.kind in ("flat", "elasticflow", "elasticflow-baseline", "profile")

    def per_event(self, spec: JobSpec) -> float:
        if self.kind == "muri":
            return _MURI_OVERHEAD.get(spec.gpus, {}).get(spec.model, _MURI_DEFAULT)
        if self.kind == "elasticflow":
            return 2.0
        return 0.0

    def restart(self, spec: JobSpec, gpus: int | None = None) -> float:
        """Seconds before a job (re)started on `gpus` GPUs (default: as requested) progresses."""
        if self.kind == "flat":
            return self.flat_s
        if self.kind == "elasticflow":
            return (math.log2(gpus or spec.gpus) + 1) * 2.0 + 27.0
        if self.kind == "elasticflow-baseline":
            return (math.log2(gpus or spec.gpus) + 1) * 2.0 + 2.0
        if self.kind == "profile":
            return self._measured_restart(spec.model, gpus or spec.gpus)
        return 0.0

    def _measured_restart(self, model: str, gpus: int) -> float:
        family = model if model in FAMILIES else for_trace_model(model)
        by_count = self.measured.get(family or "")
        if not by_count:
            return max(s for counts in self.measured.values() for s in counts.values())
        below = [g for g in by_count if g <= gpus]
        return by_count[max(below)] if below else by_count[min(by_count)]


def parse_overhead(text: str) -> OverheadModel:
    """`none`, `muri`, `elasticflow`, `elasticflow-baseline`, `flat:SECONDS` or `profile:FILE`."""
    if text in ("none", "muri", "elasticflow", "elasticflow-baseline"):
        return OverheadModel(text, text)
    if text.startswith("profile:"):
        return OverheadModel(text, "profile", measured=load_measured_overheads(
            Path(text.removeprefix("profile:"))))
    if text.startswith("flat:"):
        try:
            seconds = float(text.removeprefix("flat:"))
        except ValueError:
            raise ValueError(f"--overhead {text!r}: SECONDS must be a number") from None
        if seconds < 0 or not math.isfinite(seconds):
            raise ValueError(f"--overhead {text!r}: SECONDS must be finite and ≥ 0")
        return OverheadModel(text, "flat", seconds)
    raise ValueError(
        f"unknown overhead model {text!r}; use none, muri, elasticflow, elasticflow-baseline, "
        "flat:SECONDS or profile:FILE"
    )


def load_measured_overheads(path: Path) -> dict[str, dict[int, float]]:
    """Restart seconds per workload and GPU count from `loom profile`'s overheads.json."""
    where = f"--overhead profile:{path}"
    try:
        raw = loads_unique(path.read_text())
    except OSError as exc:
        raise ValueError(f"{where}: cannot read: {exc.strerror}") from None
    except DuplicateKeyError as dup:  # (names differ: mypyc types one name per function)
        raise ValueError(f"{where}: invalid JSON: {dup}") from None
    except json.JSONDecodeError as bad:
        raise ValueError(f"{where}: invalid JSON at line {bad.lineno}: {bad.msg}") from None
    if not isinstance(raw, dict) or raw.get("format") != OVERHEADS_FORMAT:
        raise ValueError(f"{where}: expected an object with \"format\": \"{OVERHEADS_FORMAT}\" "
                         f"(written by `loom profile`)")
    workloads = raw.get("workloads")
    if not isinstance(workloads, dict) or not workloads:
        raise ValueError(f"{where}: \"workloads\" must map a workload to its overheads")
    out: dict[str, dict[int, float]] = {}
    for name, entry in workloads.items():
        restart = entry.get("restart_s") if isinstance(entry, dict) else None
        if not isinstance(restart, dict) or not restart:
            raise ValueError(f"{where}: workloads.{name}.restart_s must map GPU counts to "
                             f"seconds")
        counts: dict[int, float] = {}
        for gpus, seconds in restart.items():
            ok_count = isinstance(gpus, str) and gpus.isdigit() and int(gpus) >= 1
            ok_seconds = (isinstance(seconds, int | float) and not isinstance(seconds, bool)
                          and math.isfinite(seconds) and seconds >= 0)
            if not (ok_count and ok_seconds):
                raise ValueError(f"{where}: workloads.{name}.restart_s[{gpus!r}] = "
                                 f"{seconds!r}; need a GPU count >= 1 and finite seconds >= 0")
            counts[int(gpus)] = float(seconds)
        out[name] = counts
    return out


def progress_segments(spec: JobSpec, placement: GpuSlots, adaptive: bool,
                      done: float) -> Segments | None:
    """A goodput-profiled job's speed on a placement (None for every other job).

    The job runs on len(placement) nodes with as many replicas as GPUs, at its fixed batch
    size, or (`adaptive`: the scheduler lets it, and the job can) at the batch size that
    maximises its goodput, re-chosen every epoch.
    """
    if spec.goodput is None:
        return None
    gpus = sum(len(g) for _, g in placement)
    batch = job_batch(spec.goodput, spec.batch_size, adaptive)
    return model_for(spec.goodput).segments(len(placement), gpus, done, batch)


def job_rates(spec: JobSpec, colocated: Sequence[JobSpec], model: OverheadModel,
              gpu_type: str | None = None, profile: ThroughputTable | None = None,
              gpus: int | None = None) -> tuple[float, float]:
    """(seconds per iteration, per-event charge) of a job, alone or sharing its GPUs.

    Sharing: a pair whose co-located throughputs are profiled (Gavel's space sharing) runs at
    the profiled rate; otherwise every member runs at the group's interleaved iteration time
    (Muri's model). An event costs each member the sum of the members' charges, as Muri's
    simulator does.
    """
    if len(colocated) < 2:
        return model.iteration_time(spec, gpu_type, gpus), model.per_event(spec)
    charge = sum(model.per_event(m) for m in colocated)
    shared = _profiled_pair(spec, colocated, gpu_type, profile)
    if shared is not None:
        return (1.0 / shared if shared > 0 else math.inf), charge
    stages = []
    for member in colocated:
        if member.stage_times_s is None:
            raise ValueError(f"job {member.job_id} has no stage times; it cannot interleave")
        stages.append(member.stage_times_s)
    return group_iteration_time(stages), charge


def _profiled_pair(spec: JobSpec, colocated: Sequence[JobSpec], gpu_type: str | None,
                   profile: ThroughputTable | None) -> float | None:
    """The job's iterations/s next to its partner, from the profile; None if not profiled."""
    if profile is None or gpu_type is None or len(colocated) != 2:
        return None
    other = colocated[1] if colocated[0].job_id == spec.job_id else colocated[0]
    if spec.job_type is None or other.job_type is None:
        return None
    rates = profile.pair(gpu_type, (spec.job_type, spec.gpus), (other.job_type, other.gpus))
    return None if rates is None else rates[0]
