"""ElasticFlow's cycle kernel compiled ahead of time, so that a run does not load numba.

`kernel.plan_cycle` under numba's JIT costs every process a noticeable start-up before its
first cycle even with numba's cache warm (numba's import, then its CPU target, which imports
scipy's BLAS; docs/validation.md has the figures). `numba.pycc` compiles the same function
once into an extension module that needs only numpy. `scripts/setup` builds it (`main`) into
`policies/elasticflow/_aot/`, named by a digest of the kernel's source and of this file, so an
edited kernel is never run from a stale build.

`plan_cycle()` gives that module's function if it is built for the current source, else
numba's JIT dispatcher (where pycc or a C compiler is missing, the build failed, or
NUMBA_DISABLE_JIT=1 asks for plain Python): the same code, compiled two ways, and the tests
hold both to the reference planner bit for bit. An exported function does not check its
arguments' types, so the loaded one is wrapped to coerce them. numba has marked pycc "pending
deprecation" since 0.57 while a replacement is developed; a release without it only means
the build fails and the JIT stays.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import structlog

HERE = Path(__file__).resolve().parent
BUILD_DIR = HERE / "_aot"

# plan_cycle(left, deadline, speed, fit, levels, level count, is-level, now, total, slot,
# descending, all_met) -> (ok, order, GPUs, next change): the types `policies.elasticflow.fast`
# always passes (float scalars as floats, `scalars`).
SIGNATURE = ("Tuple((b1, i8[::1], i8[::1], f8[::1]))(f8[::1], f8[::1], f8[:, ::1], "
             "i8[:, ::1], i8[:, ::1], i8[::1], b1[:, ::1], f8, i8, f8, b1, b1)")
_ARRAYS: tuple[tuple[type, int], ...] = (  # the array arguments' dtypes and dimensions
    (np.float64, 1), (np.float64, 1), (np.float64, 2), (np.int64, 2), (np.int64, 2),
    (np.int64, 1), (np.bool_, 2))

CycleKernel = Callable[..., tuple[bool, np.ndarray, np.ndarray, np.ndarray]]


def module_name() -> str:
    """The extension's name for the current kernel source, numpy (whose C API it links
    against) and this file (the signature)."""
    digest = hashlib.sha256()
    for source in (HERE / "kernel.py", Path(__file__)):
        digest.update(source.read_bytes())
    digest.update(np.__version__.encode())
    return f"elasticflow_cycle_{digest.hexdigest()[:16]}"


def built_path(build_dir: Path = BUILD_DIR) -> Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return build_dir / f"{module_name()}{suffix}"


def build(build_dir: Path = BUILD_DIR) -> Path:
    """Compile `plan_cycle` with numba.pycc (10-25 s); returns the module's path.
    Built in a scratch folder and moved in whole, so a concurrent loader never sees half."""
    with warnings.catch_warnings():  # "pending deprecation" since numba 0.57: see above
        warnings.simplefilter("ignore")
        pycc: Any = importlib.import_module("numba.pycc")  # untyped

    from policies.elasticflow import kernel

    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / ".gitignore").write_text("*\n")  # a build output: never committed
    target = built_path(build_dir)
    with tempfile.TemporaryDirectory(dir=build_dir) as scratch:
        cc = pycc.CC(target.name.split(".")[0])
        cc.output_dir = scratch
        cc.verbose = False
        cc.export("plan_cycle", SIGNATURE)(kernel.plan_cycle.py_func)
        cc.compile()
        os.replace(Path(scratch, target.name), target)
    for old in build_dir.glob("elasticflow_cycle_*"):  # earlier sources' builds
        if old != target:
            old.unlink(missing_ok=True)
    return target


def load_built(build_dir: Path = BUILD_DIR) -> CycleKernel | None:
    """The ahead-of-time `plan_cycle` for the current source, or None if it is not built."""
    path = built_path(build_dir)
    if not path.exists():
        return None
    name = path.name.split(".")[0]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    compiled = module.plan_cycle

    def checked(*args: Any) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray]:
        arrays: list[np.ndarray] = []
        for k, (given, (dtype, ndim)) in enumerate(zip(args[:len(_ARRAYS)], _ARRAYS,
                                                       strict=True)):
            a: np.ndarray = np.ascontiguousarray(given, dtype)
            if a.ndim != ndim:
                raise ValueError(f"plan_cycle: argument {k} has {a.ndim} dimensions, not {ndim}")
            arrays.append(a)
        now, total, slot, descending, all_met = args[len(_ARRAYS):]
        result: tuple[bool, np.ndarray, np.ndarray, np.ndarray] = compiled(
            *arrays, float(now), int(total), float(slot), bool(descending), bool(all_met))
        return result

    return checked


def plan_cycle(build_dir: Path = BUILD_DIR) -> CycleKernel:
    """The cycle kernel to run: ahead of time if built for this source, else numba's JIT."""
    if os.environ.get("NUMBA_DISABLE_JIT", "0") in ("", "0"):
        try:
            built = load_built(build_dir)
        except ImportError as exc:  # a damaged build, or one for another platform
            structlog.get_logger("loom.policies").warning(
                "ahead-of-time ElasticFlow kernel not loadable; numba's JIT runs it",
                path=str(built_path(build_dir)), reason=str(exc))
            built = None
        if built is not None:
            return built
    from policies.elasticflow import kernel

    jit: CycleKernel = kernel.plan_cycle
    return jit


def main() -> None:
    """Build the module unless it is already built for this source (`scripts/setup`)."""
    if built_path().exists():
        return
    try:
        build()
    except Exception as exc:  # no C compiler, no pycc: the JIT stays, only slower to start
        print(f"policies.elasticflow.aot: not built ({type(exc).__name__}: {exc}); "
              "ElasticFlow's kernel will load through numba's JIT instead", file=sys.stderr)
