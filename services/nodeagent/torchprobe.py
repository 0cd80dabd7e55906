"""What torch on this node can do, as one JSON line on stdout: `python -m
services.nodeagent.torchprobe`. The doctor runs it in a process of its own, with the
interpreter trainers run with, so that importing torch and creating a CUDA context never
happen in the node agent itself (a context would hold memory on a GPU for the agent's life).

It reports torch's version and the CUDA it was built for, whether CUDA works and how many
GPUs it sees, and whether a one-process gloo group (and, with CUDA, an NCCL group) can
all-reduce a tensor: the collectives the trainers' data-parallel jobs use.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import timedelta
from typing import Any

TIMEOUT = timedelta(seconds=60)


def _collective(dist: Any, torch: Any, backend: str, device: str) -> str | None:
    """None if a one-rank `backend` group all-reduces a tensor on `device`, else why not."""
    with tempfile.TemporaryDirectory(prefix="loom-probe-") as tmp:
        try:
            store = dist.FileStore(os.path.join(tmp, "store"), 1)
            dist.init_process_group(backend, store=store, rank=0, world_size=1,
                                    timeout=TIMEOUT)
            try:
                t = torch.ones(4, device=device)
                dist.all_reduce(t)
                if float(t.sum()) != 4.0:
                    return f"all_reduce gave {t.tolist()}, not ones"
            finally:
                dist.destroy_process_group()
        except Exception as exc:  # any failure is the answer
            return f"{type(exc).__name__}: {exc}"[:500]
    return None


def probe() -> dict[str, Any]:
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:
        return {"installed": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    out: dict[str, Any] = {"installed": True, "version": torch.__version__,
                           "cuda": torch.version.cuda}
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["devices"] = torch.cuda.device_count() if out["cuda_available"] else 0
    except Exception as exc:
        out.update(cuda_available=False, devices=0,
                   cuda_error=f"{type(exc).__name__}: {exc}"[:500])
    if not dist.is_available():
        out["gloo"] = out["nccl"] = "torch.distributed is not available in this build"
        return out
    out["gloo"] = (_collective(dist, torch, "gloo", "cpu") if dist.is_gloo_available()
                   else "torch was built without gloo")
    if not out["cuda_available"]:
        out["nccl"] = "no CUDA"
    elif not dist.is_nccl_available():
        out["nccl"] = "torch was built without NCCL"
    else:
        out["nccl"] = _collective(dist, torch, "nccl", "cuda:0")
        version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
        out["nccl_version"] = (".".join(str(v) for v in version)
                               if isinstance(version, tuple) else str(version))
    return out


def main() -> int:
    sys.stdout.write(json.dumps(probe()) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
