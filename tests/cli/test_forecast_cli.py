"""`loom sim --forecast-every S`: start forecasts scored in summary.json and shown under the
results; the decisions are those of the same run without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loom.cli import main
from loom.report import forecast_line


@pytest.mark.parametrize(("errors", "line"), [
    (None, None),
    ({"median": None, "p90": None, "forecasts": 0, "jobs": 0}, None),
    ({"median": 12.4, "p90": 3600.0, "first_median": 0.0, "first_p90": 7.0, "forecasts": 1200,
      "jobs": 40},
     "start forecasts: |forecast - start| median 12 s, p90 3,600 s over 1,200 forecasts of 40 "
     "jobs (the first of each wait: median 0 s, p90 7 s)"),
])
def test_forecast_line(errors: dict[str, object] | None, line: str | None) -> None:
    assert forecast_line({"forecast_error_s": errors}) == line


def test_sim_with_forecasts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = {}
    for name, extra in (("off", []), ("on", ["--forecast-every", "600"])):
        assert main(["sim", "--trace", "tiresias/60_job", "--cluster", "8",
                     "--policy", "srtf", "--quiet", "--no-plot", "--out", str(tmp_path / name),
                     *extra]) == 0
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    printed = capsys.readouterr().out
    assert runs["on"]["decision_digest"] == runs["off"]["decision_digest"]
    assert runs["off"]["forecast_error_s"] is None
    errors = runs["on"]["forecast_error_s"]
    assert errors["forecasts"] > 0 and errors["jobs"] > 0 and errors["median"] >= 0
    assert "start forecasts: |forecast - start| median" in printed


def test_a_negative_cadence_is_refused() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--trace", "tiresias/60_job", "--cluster", "n1g4", "--policy", "srtf",
              "--forecast-every", "-1"])
    assert exc.value.code == 2
