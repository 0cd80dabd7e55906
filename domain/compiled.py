"""The simulation's hot modules compiled to C with mypyc, loaded in place of their source.

A simulated event runs through the scheduler, placer, node and metrics cores and the shell,
bus and kernel between them, all pure Python. mypyc compiles those same modules, from their
type hints, into extension modules that decide bit for bit alike (docs/validation.md has the
figures). `scripts/setup` builds them (`main`, where mypy's dev extra is installed) into
`build/mypyc/<digest>/`, the digest taken over the source of every module they could depend on
(all of `schemas`, `domain`, `policies` and `services`, about 3 ms to read), so nothing is run
from a stale build: after an edit the whole set runs from source until rebuilt.

Each package that holds a compiled module calls `extend(__path__, __name__)` in its
`__init__.py`, which puts the build's copy of the package ahead of the source (only where the
build is current). `LOOM_PURE_PYTHON=1` runs everything from source.

This module is never compiled itself, and imports nothing of Loom's.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # no mypy installed: nothing is compiled, the decorator does nothing
        def mypyc_attr(*args: Any, **kwargs: Any) -> Any:
            return lambda cls: cls

__all__ = ["MODULES", "active", "build", "extend", "main", "mypyc_attr"]

ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = ROOT / "build" / "mypyc"

# What a simulated event runs through; compiled as one group (calls between them are C calls).
MODULES: tuple[str, ...] = (
    "domain.free_gpus", "domain.gang_shapes", "domain.interleave", "domain.keep_places",
    "domain.overhead",
    "domain.placement", "domain.progress", "domain.topology",
    "services.runtime.bus", "services.runtime.clock", "services.runtime.effects",
    "services.runtime.kernel", "services.runtime.service", "services.runtime.trusted",
    "services.scheduler.core", "services.scheduler.estimate", "services.scheduler.in_place",
    "services.scheduler.intake", "services.scheduler.jobs", "services.scheduler.reports",
    "services.scheduler.views",
    "services.metrics.core",
    "services.placer.core",
    "services.nodeagent.gate", "services.nodeagent.simfleet", "services.nodeagent.simnode",
)


_PACKAGES = ("schemas", "domain", "policies", "services")  # what MODULES may depend on


def _source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


@cache
def digest() -> str:
    """Names the build of the current sources (and this Python's extension ABI)."""
    h = hashlib.sha256()
    h.update((sysconfig.get_config_var("EXT_SUFFIX") or "").encode())
    h.update(" ".join(MODULES).encode())
    for package in _PACKAGES:
        for path in sorted(ROOT.joinpath(package).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    return BUILD_ROOT / digest()


@cache
def active() -> bool:
    """Whether the compiled modules run (built for the current sources, not turned off);
    on the first call, loads the group's shared library they all link against."""
    if os.environ.get("LOOM_PURE_PYTHON", "") not in ("", "0") or not BUILD_ROOT.is_dir():
        return False  # (no build at all: the sources are not read for a digest)
    folder = build_dir()
    shared = sorted(folder.glob("*__mypyc*"))
    if len(shared) != 1:
        return False
    name = shared[0].name.split(".")[0]
    if name not in sys.modules:
        loader = importlib.machinery.ExtensionFileLoader(name, str(shared[0]))
        spec = importlib.util.spec_from_file_location(name, shared[0], loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loader.exec_module(module)
    return True


def extend(path: list[str], package: str) -> None:
    """Put the build's copy of `package` ahead of its source, if the build is current."""
    if any(m.rpartition(".")[0] == package for m in MODULES) and active():
        path.insert(0, str(build_dir().joinpath(*package.split("."))))


def build() -> Path:
    """Compile `MODULES` with mypyc (a minute or so); returns the build's folder. Built in a
    scratch folder, then moved in whole, so a concurrent import never sees half a build."""
    target = build_dir()
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD_ROOT) as scratch:
        # In a child from the project's root: mypyc names modules by their paths from there
        # and reads mypy's settings (pyproject.toml) there.
        subprocess.run([sys.executable, "-c", _BUILD, scratch,
                        *(str(_source(m).relative_to(ROOT)) for m in MODULES)],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        if not target.is_dir():  # else another setup built it meanwhile
            os.replace(Path(scratch, "lib"), target)
    for old in BUILD_ROOT.iterdir():  # earlier sources' builds, not another setup's scratch
        if old != target and old.is_dir() and not old.name.startswith("tmp"):
            shutil.rmtree(old, ignore_errors=True)
    return target


_BUILD = """
import os, sys
from setuptools import Distribution
from mypyc.build import mypycify
scratch, paths = sys.argv[1], sys.argv[2:]
dist = Distribution({"name": "loom-compiled", "ext_modules": mypycify(
    paths, opt_level="3", target_dir=os.path.join(scratch, "c"))})
cmd = dist.get_command_obj("build_ext")
cmd.build_lib, cmd.build_temp = os.path.join(scratch, "lib"), os.path.join(scratch, "tmp")
cmd.parallel = os.cpu_count() or 1
dist.run_command("build_ext")
"""


def main() -> None:
    """Build unless built for the current sources (`scripts/setup`). Without mypyc (no dev
    extra) nothing is built; a failed build says why. Either way everything then runs from
    source, only slower."""
    if build_dir().is_dir() or importlib.util.find_spec("mypyc") is None:
        return
    try:
        build()
    except Exception as exc:
        print(f"domain.compiled: not built ({type(exc).__name__}: {exc}); "
              "the simulation runs from source", file=sys.stderr)
