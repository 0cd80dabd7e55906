"""scripts/setup's filter of pip's output (scripts/pip-filter): setuptools' warning banners go,
whatever their category or indentation; errors stay."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

FILTER = Path(__file__).resolve().parents[2] / "scripts" / "pip-filter"
STARS = "*" * 80


def _banner(category: str, indent: str, body: list[str]) -> list[str]:
    return [f"{indent}/v/site-packages/setuptools/command/editable_wheel.py:354: "
            f"{category}: Editable installation.", f"{indent}!!", indent,
            *[f"{indent}        {line}" for line in (STARS, *body, STARS)], indent,
            f"{indent}!!", f'{indent}  with strategy, WheelFile(wheel_path, "w") as wheel_obj:']


EDITABLE = ["Please be careful with folders in your working directory with the same",
            "name as your package as they may take precedence during imports."]
LICENSE = ["Please consider removing the following classifiers in favor of a SPDX license:",
           "License :: OSI Approved :: Apache Software License",
           "See https://packaging.python.org/en/latest/guides/writing-pyproject-toml/"]
ERROR = "ERROR: Could not find a version that satisfies the requirement nope==1"


def _filtered(lines: list[str]) -> list[str]:
    if shutil.which("awk") is None:
        pytest.skip("no awk")
    done = subprocess.run(["awk", "-f", str(FILTER)], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


@pytest.mark.parametrize("lines", [
    pytest.param(_banner("BuildBackendWarning", "  ", EDITABLE), id="pip-indented"),
    pytest.param(_banner("InformationOnly", "", EDITABLE), id="information-only"),
    pytest.param(_banner("SetuptoolsDeprecationWarning", "  ", LICENSE), id="license"),
    pytest.param(["WARNING: Location 'https://mirror/x' is ignored: it is not a URL", "", "  "],
                 id="pip-notes"),
])
def test_the_noise_goes(lines: list[str]) -> None:
    assert _filtered(lines) == []
    assert _filtered([*lines, ERROR]) == [ERROR]


def test_a_warning_without_a_banner_takes_only_its_own_line() -> None:
    lines = ["/v/site-packages/setuptools/dist.py:1: SetuptoolsWarning: odd", ERROR]
    assert _filtered(lines) == [ERROR]


def test_setup_uses_the_filter() -> None:
    setup = (FILTER.parent / "setup").read_text()
    assert "awk -f scripts/pip-filter" in setup
