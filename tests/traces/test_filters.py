"""`--trace-filter`: the expression language, and the cuts applied while a trace is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.traces.production_builders import attempt, philly_jobs, write_helios, write_philly_log
from traces import FilterError, TraceError, load_trace, parse_filter

GOOD: list[tuple[str, dict[str, Any]]] = [
    ("window=0:30d", {"start_s": 0.0, "end_s": 30 * 86400.0}),
    ("window=:90m", {"start_s": None, "end_s": 5400.0}),
    ("window=1.5h:", {"start_s": 5400.0, "end_s": None}),
    ("window=3600:7200s", {"start_s": 3600.0, "end_s": 7200.0}),
    ("vc=vc6YE,vcLJZ", {"tenants": frozenset({"vc6YE", "vcLJZ"})}),
    ("tenant=a", {"tenants": frozenset({"a"})}),
    ("gpus>=8", {"min_gpus": 8, "max_gpus": None}),
    ("gpus <= 4", {"min_gpus": None, "max_gpus": 4}),
    ("gpus>=2 gpus<=8", {"min_gpus": 2, "max_gpus": 8}),
    ("gpus=8", {"min_gpus": 8, "max_gpus": 8}),
    ("state=completed,Failed", {"states": frozenset({"COMPLETED", "FAILED"})}),
    ("  window=0:1d ;vc=a;  gpus>=2  ", {"start_s": 0.0, "end_s": 86400.0,
                                         "tenants": frozenset({"a"}), "min_gpus": 2}),
]


@pytest.mark.parametrize(("text", "expected"), GOOD, ids=[g[0] for g in GOOD])
def test_good_expressions(text: str, expected: dict[str, Any]) -> None:
    flt = parse_filter(text)
    assert {k: getattr(flt, k) for k in expected} == expected
    assert flt.text == text.strip()


BAD: list[tuple[str, str]] = [
    ("", "is empty"),
    ("gpus", "expected KEY=VALUE"),
    ("user=alice", "unknown key 'user'; expected window, vc (or tenant), gpus or state"),
    ("gpus>=x", "expected a whole number of GPUs >= 1, got 'x'"),
    ("gpus>=0", "expected a whole number of GPUs >= 1"),
    ("gpus>=8 gpus>=4", "gpus is given twice"),
    ("gpus=8 gpus<=9", "gpus is given twice"),
    ("gpus>=8 gpus<=4", "keep no job"),
    ("vc>=a", "vc takes '=', not '>='"),
    ("vc=a,,b", "no empty name"),
    ("state=", "no empty name"),
    ("window=5", "expected window=START:END"),
    ("window=:", "cuts nothing"),
    ("window=2d:1d", "ends before it starts"),
    ("window=1w:", "expected a time such as 3600, 90m, 12h or 7d, got '1w'"),
    ("window=0:1d window=1d:2d", "window is given twice"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD, ids=[b[0] or "empty" for b in BAD])
def test_bad_expressions_say_what_was_expected(text: str, fragment: str) -> None:
    with pytest.raises(FilterError) as info:
        parse_filter(text)
    assert fragment in str(info.value)
    assert str(info.value).startswith("trace filter ")
    assert isinstance(info.value, ValueError)  # the CLI's exit 2


def _helios(tmp_path: Path) -> Path:
    # j<h> submitted at hour h, of VC a (even h) or b (odd), with 2**h GPUs; j5 failed.
    rows = [{"submit_time": f"2020-04-01 {h:02d}:00:00", "start_time": f"2020-04-01 {h:02d}:00:00",
             "vc": "ab"[h % 2], "gpu_num": str(2 ** h),
             "state": "FAILED" if h == 5 else "COMPLETED"} for h in range(8)]
    rows.append({"gpu_num": "0"})  # never counted as filtered: it is skipped
    return write_helios(tmp_path, rows)


CUTS: list[tuple[str, list[str], float]] = [
    ("window=2h:5h", ["j2", "j3", "j4"], 0.0),  # re-based: j2 now at 0
    ("window=:2h", ["j0", "j1"], 0.0),
    ("window=6h:", ["j6", "j7"], 0.0),
    ("vc=a", ["j0", "j2", "j4", "j6"], 0.0),
    ("gpus>=16", ["j4", "j5", "j6", "j7"], 4 * 3600.0),
    ("gpus<=2", ["j0", "j1"], 0.0),
    ("state=failed", ["j5"], 5 * 3600.0),
    ("window=1h:7h vc=b gpus>=4 state=COMPLETED", ["j3"], 2 * 3600.0),  # not j5: failed
]


@pytest.mark.parametrize(("text", "kept", "first_submit"), CUTS, ids=[c[0] for c in CUTS])
def test_cuts_on_a_streamed_trace(tmp_path: Path, text: str, kept: list[str],
                                  first_submit: float) -> None:
    trace = load_trace(_helios(tmp_path), trace_filter=text)
    assert [j.job_id for j in trace.iter_jobs()] == kept
    assert trace.job_count == len(kept) and trace.filtered_out == 8 - len(kept)
    assert trace.jobs[0].submit_time_s == first_submit
    assert dict(trace.skipped) == {"no GPUs": 1}
    assert trace.trace_filter is not None and trace.trace_filter.text == text


def test_cuts_keep_the_order_of_an_unsorted_file(tmp_path: Path) -> None:
    hours = [5, 1, 7, 0, 3]
    rows = [{"submit_time": f"2020-04-01 {h:02d}:00:00", "start_time": f"2020-04-01 {h:02d}:00:00",
             "gpu_num": str(h + 1)} for h in hours]
    trace = load_trace(write_helios(tmp_path, rows), trace_filter="gpus>=2 window=:6h")
    assert [(j.job_id, j.submit_time_s) for j in trace.jobs] == [
        ("j1", 3600.0), ("j4", 3 * 3600.0), ("j0", 5 * 3600.0)]


def test_philly_restarts_count_only_kept_jobs(tmp_path: Path) -> None:
    twice = [attempt("2017-10-03 06:40:00", "2017-10-03 06:50:00")] * 2
    jobs = philly_jobs(3, attempts=twice)
    jobs[1]["vc"] = "other"
    trace = load_trace(write_philly_log(tmp_path, jobs), trace_filter="vc=ee9e8c")
    assert (trace.job_count, trace.restarts) == (2, 2)


def test_research_trace_cuts_move_deadlines_with_the_window() -> None:
    whole = load_trace("elasticflow/resnet_cifar")
    first = whole.jobs[0].submit_time_s
    cut = load_trace("elasticflow/resnet_cifar", trace_filter="window=1s: gpus>=1")
    assert cut.job_count == whole.job_count - 1 and cut.filtered_out == 1
    for before, after in zip(whole.jobs[1:], cut.jobs, strict=True):
        assert after.submit_time_s == pytest.approx(before.submit_time_s - first - 1)
        assert before.deadline_s is not None and after.deadline_s is not None
        assert after.deadline_s == pytest.approx(before.deadline_s - first - 1)
    big = load_trace("muri/trace3", trace_filter="gpus>=8")
    assert big.job_count and all(j.gpus >= 8 for j in big.jobs)
    assert big.job_count + big.filtered_out == 992


def test_state_cut_on_a_trace_without_states(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="the tiresias format records no job states"):
        load_trace("tiresias/60_job", trace_filter="state=COMPLETED")
