"""`loom demo` and `loom up` with PyTorch trainers check that PyTorch is there before they
start anything: without it, exit 2 at once with the one command that installs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loom.preflight import MissingDependency, install_command, require_torch

# `loom` as a user runs it, but on an interpreter where `import torch` fails.
WITHOUT_TORCH = ("import sys; sys.modules['torch'] = None; from loom.cli import main; "
                 "sys.exit(main(sys.argv[1:]))")


def _loom_without_torch(args: list[str], tmp_path: Path) -> tuple[int, str, float]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, " ".join(done.stderr.split()), time.monotonic() - t0


@pytest.mark.parametrize("args", [
    ["demo"],
    ["demo", "--timeout", "5"],
    ["up", "--local-nodes", "1", "--prometheus-port", "0"],
])
def test_without_torch_it_exits_2_at_once_with_the_install_command(
        args: list[str], tmp_path: Path) -> None:
    rc, err, took = _loom_without_torch(args, tmp_path)
    assert rc == 2, err
    assert took < 10
    assert "PyTorch is not installed" in err and install_command("torch") in err
    assert "Traceback" not in err
    # Nothing was started: no NATS store, no demo folder, no log.
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("loom-")]


def test_simulated_trainers_need_no_torch(tmp_path: Path) -> None:
    """`loom up --trainers simulated` runs no PyTorch: the check lets it by (it then fails
    on the bad flag below, after the check, showing it got that far)."""
    rc, err, _ = _loom_without_torch(["up", "--local-nodes", "1", "--trainers", "simulated",
                                      "--prometheus-port", "70000"], tmp_path)
    assert rc == 2 and "PyTorch" not in err and "70000: not a port" in err


def test_require_torch_passes_where_torch_is_installed() -> None:
    pytest.importorskip("torch")
    require_torch("this test")


def test_the_message_names_what_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependency, match="loom demo runs PyTorch trainers"):
        require_torch("loom demo")
