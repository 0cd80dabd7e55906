"""The per-GPU health checks: ECC, retired or remapped memory, XIDs, temperature, throttling.

Each judges one GPU's NVML health read (`GpuHealth`): what fails it (the scheduler then takes
the GPU out of service), what only warns, and the fix. The doctor runs them, in its
`PER_GPU` order, on every GPU still answering, at start-up and on every heartbeat.
"""

from __future__ import annotations

from services.nodeagent.check_result import Check
from services.nodeagent.gpu import THROTTLE_BAD, THROTTLE_REASONS, GpuHealth

# XIDs after which a GPU must not take work until it is reset (or replaced): NVIDIA's XID
# catalogue (docs.nvidia.com/deploy/xid-errors) lists a GPU reset or a reboot as their action.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error", 62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure", 74: "NVLink error",
    79: "GPU has fallen off the bus", 95: "uncontained ECC error", 119: "GSP RPC timeout",
    120: "GSP error", 140: "unrecovered ECC error",
}
# Others worth naming: mostly a job's own fault (13, 31, 43, 45), or a GPU to watch (63, 92, 94).
OTHER_XIDS: dict[int, str] = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 63: "ECC page retirement or row remapping recorded",
    92: "high single-bit ECC error rate", 94: "contained ECC error",
}
RETIRED_PAGES_RMA = 60  # NVIDIA's RMA threshold for pages retired on one GPU


def _ecc(h: GpuHealth) -> Check:
    i = h.index
    if h.ecc_enabled is None:
        return Check("ecc", "pass", f"GPU {i}: not reported (no ECC on this GPU)", gpu=i)
    if not h.ecc_enabled:
        return Check("ecc", "warn", f"GPU {i}: ECC disabled",
                     f"enable it (nvidia-smi -i {i} -e 1) and reboot", gpu=i)
    counts = f"{h.ecc_uncorrected or 0} uncorrectable, {h.ecc_corrected or 0} corrected " \
             "(since the driver loaded)"
    if h.ecc_uncorrected:
        return Check("ecc", "fail", f"GPU {i}: {counts}",
                     f"GPU {i} is out of service: reset it (nvidia-smi -r -i {i}) or reboot, "
                     "then restart the node agent; if errors come back, replace the GPU",
                     gpu=i)
    if h.ecc_pending:
        return Check("ecc", "warn", f"GPU {i}: {counts}; an ECC mode change waits for a reboot",
                     "reboot the node when it is drained", gpu=i)
    return Check("ecc", "pass", f"GPU {i}: {counts}", gpu=i)


def _memory(h: GpuHealth) -> Check:
    i = h.index
    parts = []
    if h.remapped_rows is not None:
        parts.append(f"{h.remapped_rows[0]} correctable and {h.remapped_rows[1]} "
                     "uncorrectable rows remapped")
    if h.retired_pages is not None:
        parts.append(f"{h.retired_pages} pages retired")
    seen = f"GPU {i}: " + ("; ".join(parts) or "not reported (neither page retirement nor "
                                                 "row remapping on this GPU)")
    if h.remap_failed:
        return Check("memory", "fail", f"{seen}; a row remap FAILED",
                     f"GPU {i} is out of service: replace it (NVIDIA's RMA process)", gpu=i)
    if h.retired_pages is not None and h.retired_pages >= RETIRED_PAGES_RMA:
        return Check("memory", "warn", f"{seen}, at NVIDIA's RMA threshold",
                     "plan to replace the GPU", gpu=i)
    if h.remap_pending or h.retired_pending:
        return Check("memory", "warn", f"{seen}; a remap or retirement waits for a reset",
                     f"reset the GPU when it is idle (nvidia-smi -r -i {i}) or reboot", gpu=i)
    return Check("memory", "pass", seen, gpu=i)


def _xid(h: GpuHealth) -> Check:
    i = h.index
    if h.xid_watch is not None and not h.xids:
        return Check("xid", "skip", f"GPU {i}: not watched: {h.xid_watch}", gpu=i)
    fatal = [x for x in h.xids if x in FATAL_XIDS]
    named = ", ".join(f"XID {x} ({FATAL_XIDS.get(x) or OTHER_XIDS.get(x, 'see NVIDIA')})"
                      for x in dict.fromkeys(h.xids))
    if fatal:
        return Check("xid", "fail", f"GPU {i}: {named}",
                     f"GPU {i} is out of service: reset it (nvidia-smi -r -i {i}) or reboot, "
                     "then restart the node agent; see NVIDIA's XID catalogue for the error",
                     gpu=i)
    if h.xids:
        return Check("xid", "warn", f"GPU {i}: {named}",
                     "usually the job's own fault; look at the job's log and `dmesg | grep "
                     "Xid`", gpu=i)
    return Check("xid", "pass", f"GPU {i}: none since the agent began watching", gpu=i)


def _temperature(h: GpuHealth) -> Check:
    i = h.index
    if h.temperature_c is None:
        return Check("temperature", "pass", f"GPU {i}: not reported", gpu=i)
    t = h.temperature_c
    seen = f"GPU {i}: {t} °C (slows down at {h.slowdown_c or '?'} °C, shuts down at " \
           f"{h.shutdown_c or '?'} °C)"
    fix = "check the node's cooling: fans (nvidia-smi -q -d FAN), airflow, the room"
    if h.shutdown_c is not None and t >= h.shutdown_c:
        return Check("temperature", "fail", seen, f"GPU {i} is out of service until it cools; "
                                                   + fix, gpu=i)
    if h.slowdown_c is not None and t >= h.slowdown_c:
        return Check("temperature", "warn", seen, fix, gpu=i)
    return Check("temperature", "pass", seen, gpu=i)


def _throttle(h: GpuHealth) -> Check:
    i = h.index
    if h.throttle_reasons is None:
        return Check("throttle", "pass", f"GPU {i}: not reported", gpu=i)
    reasons = [why for bit, why in THROTTLE_REASONS.items() if h.throttle_reasons & bit]
    seen = f"GPU {i}: {', '.join(reasons) or 'none'}"
    if h.throttle_reasons & THROTTLE_BAD:
        return Check("throttle", "warn", seen,
                     "thermal: check cooling; power brake or hardware slowdown: check the "
                     "power supply and cables (nvidia-smi -q -d PERFORMANCE)", gpu=i)
    return Check("throttle", "pass", seen, gpu=i)


# Which of NVML's failed reads (`GpuHealth.errors`, named by what was read) each check needed.
_READS = {"ecc": ("ECC",), "memory": ("retired pages", "row remapping"), "xid": (),
          "temperature": ("temperature",), "throttle": ("throttling",)}


def _unread(check: Check, h: GpuHealth) -> Check:
    """A check that passed on what could be read warns of what NVML refused to read."""
    missed = [e for e in h.errors if e.startswith(_READS[check.name])]
    if check.status != "pass" or not missed:
        return check
    return Check(check.name, "warn", f"{check.measured}; could not read {'; '.join(missed)}",
                 "NVML refused the read: run the agent as a user NVML allows it to (root, or "
                 "see `nvidia-smi -q` as that user), or upgrade the driver", gpu=check.gpu)


_BY_NAME = {"ecc": _ecc, "memory": _memory, "xid": _xid, "temperature": _temperature,
            "throttle": _throttle}


def check_gpu(name: str, h: GpuHealth) -> Check:
    """Check `name` (one of the doctor's `PER_GPU`) of one GPU, warning where NVML would not
    say all it needed."""
    return _unread(_BY_NAME[name](h), h)
