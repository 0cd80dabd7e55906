"""The mypyc build of the simulation's hot modules: used only where it is current, and it
decides exactly as the source does."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from domain import compiled

ROOT = Path(__file__).resolve().parents[2]

# A short run's decision digest, printed by a child (pure or compiled, by its environment).
RUN = """
import asyncio, importlib, json
from domain import compiled
from loom.simulate import SimConfig, run_simulation
from traces import load_cluster, load_trace
t = load_trace("muri/trace3")
cfg = SimConfig(policy=POLICY, jobs=t.jobs[:300], cluster=load_cluster("n8g8"),
                trace_name=t.name, overhead=t.default_overhead)
summary = asyncio.run(run_simulation(cfg)).summary
where = importlib.import_module("services.scheduler.core").__file__
print(json.dumps({"digest": summary["decision_digest"], "compiled": compiled.active(),
                  "from": where}))
"""


def child(policy: str, pure: bool) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOOM_PURE_PYTHON": "1" if pure else "0"}
    out = subprocess.run([sys.executable, "-c", RUN.replace("POLICY", repr(policy))],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         check=True).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not compiled.active(), reason="no current mypyc build (scripts/setup)")
@pytest.mark.parametrize("policy", ["srtf", "tiresias", "muri-s"])
def test_the_compiled_modules_decide_as_the_source_does(policy: str) -> None:
    built, source = child(policy, pure=False), child(policy, pure=True)
    assert built["compiled"] and str(built["from"]).startswith(str(compiled.build_dir()))
    assert not source["compiled"] and str(source["from"]).endswith("services/scheduler/core.py")
    assert built["digest"] == source["digest"]


@pytest.mark.skipif(importlib.util.find_spec("mypyc") is None
                    or os.environ.get("LOOM_PURE_PYTHON", "") not in ("", "0"),
                    reason="no mypyc to build with, or running from source on purpose")
def test_where_mypyc_is_installed_the_build_is_current() -> None:
    """Else a build that broke would leave the suite running from source unnoticed."""
    assert compiled.active(), (
        f"no mypyc build for the current sources in {compiled.build_dir()}: run "
        "./scripts/setup dev (a failed build says why)")


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project root with one source file in each package the digest reads."""
    for package in ("schemas", "domain", "policies", "services"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "mod.py").write_text(f"NAME = {package!r}\n")
    monkeypatch.setattr(compiled, "ROOT", tmp_path)
    monkeypatch.setattr(compiled, "BUILD_ROOT", tmp_path / "build" / "mypyc")
    compiled.digest.cache_clear()
    compiled.active.cache_clear()
    yield tmp_path
    compiled.digest.cache_clear()
    compiled.active.cache_clear()


@pytest.mark.parametrize(("change", "differs"), [
    (lambda root: None, False),
    (lambda root: (root / "policies" / "mod.py").write_text("NAME = 'edited'\n"), True),
    (lambda root: (root / "schemas" / "new.py").write_text(""), True),
    (lambda root: (root / "domain" / "notes.txt").write_text("not a module"), False),
], ids=["nothing", "an edited module", "a new module", "a file not a module"])
def test_any_edit_to_a_module_names_another_build(tree: Path, change: object,
                                                  differs: bool) -> None:
    before = compiled.digest()
    change(tree)  # type: ignore[operator]
    compiled.digest.cache_clear()
    assert (compiled.digest() != before) is differs


@pytest.mark.parametrize("stale", [True, False], ids=["an-earlier-sources-build", "no-build"])
def test_without_a_current_build_everything_runs_from_source(tree: Path, stale: bool) -> None:
    if stale:
        earlier = compiled.BUILD_ROOT / "0123456789abcdef"
        (earlier / "domain").mkdir(parents=True)
        (earlier / "abc__mypyc.so").write_bytes(b"")
    path = [str(tree / "domain")]
    compiled.extend(path, "domain")
    assert not compiled.active() and path == [str(tree / "domain")]


def test_pure_python_asked_for_turns_the_build_off(tree: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    compiled.build_dir().mkdir(parents=True)
    (compiled.build_dir() / "abc__mypyc.so").write_bytes(b"")  # never loaded: turned off
    monkeypatch.setenv("LOOM_PURE_PYTHON", "1")
    assert not compiled.active()
