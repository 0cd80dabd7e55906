"""What a command needs, checked before it starts anything: a missing piece is one message
with the one command that installs it (exit 2), not minutes of failing trainers."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

# The checkout this package runs from, where `scripts/setup` lives (an editable install).
ROOT = Path(__file__).resolve().parents[1]


class MissingDependency(ValueError):
    """Something a command needs is not installed; the message says how to install it."""


def install_command(extra: str) -> str:
    """The one command that installs Loom's `extra` into the running environment: the
    README's setup script when this is its checkout's .venv, else pip on this interpreter
    (from the checkout where there is one)."""
    python = shlex.quote(sys.executable)
    if not (ROOT / "pyproject.toml").is_file():
        return f"{python} -m pip install 'loom-scheduler[{extra}]'"
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve() and \
            (ROOT / "scripts" / "setup").is_file():
        return f"cd {shlex.quote(str(ROOT))} && ./scripts/setup {extra}"
    return f"{python} -m pip install -e {shlex.quote(f'{ROOT}[{extra}]')}"


def require_torch(what: str) -> None:
    """Refuse to start `what` (PyTorch trainers) where `import torch` would fail: the
    trainers run on this interpreter, so they would each fail on their first line."""
    if _importable("torch"):
        return
    raise MissingDependency(
        f"{what} runs PyTorch trainers, and PyTorch is not installed for {sys.executable}; "
        f"install it with: {install_command('torch')}")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without spec
        return False
