"""locks/: every dependency pyproject.toml declares is pinned, with hashes, and the locks agree.

What drifts when someone edits pyproject.toml and forgets `./scripts/lock`: a new dependency
missing from a lock (a fresh machine would refuse to install in hash mode, or run untested
code), a pin that no longer satisfies the declared range, two locks disagreeing on a version.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
LOCKS = REPO / "locks"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
APART = {"torch"}  # installed from its own index: locks/torch-cpu.txt, the Dockerfile's ARG


def read_lock(path: Path) -> dict[str, tuple[Version, int]]:
    """name -> (pinned version, number of hashes) for every pin of a lock file."""
    pins: dict[str, tuple[Version, int]] = {}
    name = ""
    for line in path.read_text().splitlines():
        match = PIN.match(line)
        if match:
            name = canonicalize_name(match[1])
            pins[name] = (Version(match[2]), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
    return pins


def declared(extra: str | None) -> list[Requirement]:
    lines = PROJECT["dependencies"] + (EXTRAS[extra] if extra else [])
    return [Requirement(line.split("#")[0]) for line in lines]


@pytest.mark.parametrize("extra", [None, *EXTRAS])
def test_each_extra_has_a_lock_that_pins_what_it_declares(extra: str | None) -> None:
    path = LOCKS / f"{extra or 'base'}.txt"
    assert path.exists(), f"{path.name} missing: run ./scripts/lock"
    pins = read_lock(path)
    for req in declared(extra):
        name = canonicalize_name(req.name)
        if name in APART:
            continue
        assert name in pins, f"{path.name} does not pin {req.name}: run ./scripts/lock"
        version, hashes = pins[name]
        assert req.specifier.contains(version, prereleases=True), \
            f"{path.name} pins {req.name} {version}, outside pyproject's '{req}'"
        assert hashes > 0, f"{path.name}: {req.name} has no hash"
    assert not APART & set(pins), f"{path.name} must leave {APART} to its own index"


def test_every_pin_has_a_hash_and_all_locks_agree() -> None:
    seen: dict[str, tuple[Version, str]] = {}
    for path in sorted(LOCKS.glob("*.txt")):
        for name, (version, hashes) in read_lock(path).items():
            assert hashes > 0, f"{path.name}: {name}=={version} has no hash"
            first = seen.setdefault(name, (version, path.name))
            assert first[0] == version, \
                f"{name}: {first[1]} pins {first[0]}, {path.name} pins {version}"


def test_torch_is_the_pinned_cpu_wheel_everywhere() -> None:
    pinned = [Requirement(r.split("#")[0]) for r in EXTRAS["torch"]]
    (torch,) = [r for r in pinned if r.name == "torch"]
    (version, hashes), = read_lock(LOCKS / "torch-cpu.txt").values()
    assert torch.specifier.contains(version) and version.local == "cpu" and hashes == 1
    assert read_lock(LOCKS / "all.txt")["torch"][0] == version
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert f"ARG TORCH_VERSION={version.public}" in dockerfile


def test_setup_and_dockerfile_install_from_the_locks() -> None:
    setup = (REPO / "scripts" / "setup").read_text()
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    for text in (setup, dockerfile):
        assert "--require-hashes" in text and "locks/build.txt" in text
        assert "locks/base.txt" in text
