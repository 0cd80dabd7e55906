"""JSON inputs a person writes refuse a key given twice (the last would silently win)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from domain.overhead import load_measured_overheads
from traces.throughputs import load_throughputs


@pytest.mark.parametrize(("load", "text"), [
    (load_throughputs, '{"v100": {"resnet18": 1.0}, "v100": {"resnet18": 2.0}}'),
    (load_measured_overheads, '{"format": "a", "format": "b", "workloads": {}}'),
], ids=["throughputs", "overheads"])
def test_a_repeated_key_is_refused_with_its_name(load: Callable[[Path], object], text: str,
                                                 tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"key '(v100|format)' appears twice") as err:
        load(path)
    assert str(path) in str(err.value)
