from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

# The trainer needs the `torch` extra (pip install torch==2.13.0, the CPU wheel); without it
# these tests are not collected rather than failing at import.
if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """In-process training uses one CPU thread, as the trainer processes do (2 shared cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
