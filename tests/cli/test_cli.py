from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from loom.cli import main
from tests.builders import make_job

TRACE = "tiresias/60_job"
CLUSTER = "tiresias/cluster_spec"


def test_sim_writes_summary_and_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sim", "--trace", TRACE, "--cluster", CLUSTER, "--policy", "srtf",
               "--out", str(tmp_path)])
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("policy", "trace", "cluster", "jobs", "finished", "avg_jct_s", "p50_jct_s",
                "p99_jct_s", "makespan_s", "deadline_ratio", "gpu_util", "events", "wall_s",
                "decision_digest"):
        assert key in summary, key
    assert summary["jobs"] == summary["finished"] == 60 and summary["deadline_ratio"] is None
    assert summary["overhead"] == "none"  # Tiresias traces default to their origin's model
    rows = list(csv.DictReader((tmp_path / "jobs.csv").open()))
    assert len(rows) == 60 and {"submit_s", "start_s", "end_s", "jct_s", "preemptions"} <= set(
        rows[0])
    jcts = [float(r["jct_s"]) for r in rows]
    assert sum(jcts) / len(jcts) == pytest.approx(summary["avg_jct_s"])
    assert (tmp_path / "jct_cdf.png").read_bytes().startswith(b"\x89PNG")
    assert "srtf" in capsys.readouterr().out


def test_same_inputs_give_the_same_decisions(tmp_path: Path) -> None:
    digests = []
    for i in range(2):
        out = tmp_path / str(i)
        assert main(["sim", "--trace", TRACE, "--cluster", CLUSTER, "--policy", "tiresias",
                     "--overhead", "muri", "--out", str(out)]) == 0
        digests.append(json.loads((out / "summary.json").read_text())["decision_digest"])
    assert digests[0] == digests[1]


def test_no_plot_skips_only_the_plot(tmp_path: Path) -> None:
    summaries = {}
    for flag in ((), ("--no-plot",)):
        out = tmp_path / ("plain" if not flag else "no-plot")
        assert main(["sim", "--trace", TRACE, "--cluster", CLUSTER, "--policy", "srtf",
                     "--out", str(out), *flag]) == 0
        assert (out / "jct_cdf.png").exists() == (not flag)
        assert (out / "jobs.csv").exists()
        summaries[flag] = json.loads((out / "summary.json").read_text())
    plain, no_plot = summaries.values()
    assert plain["decision_digest"] == no_plot["decision_digest"]


def test_round_mode_and_overhead_options_change_the_run(tmp_path: Path) -> None:
    def run(*extra: str) -> dict[str, object]:
        out = tmp_path / "-".join(extra or ("base",)).replace(":", "_")
        assert main(["sim", "--trace", TRACE, "--cluster", CLUSTER, "--policy", "srtf",
                     "--out", str(out), *extra]) == 0
        return json.loads((out / "summary.json").read_text())  # type: ignore[no-any-return]

    base, rounds, flat = run(), run("--round-s", "360"), run("--overhead", "flat:30")
    assert rounds["replan"] == "round" and rounds["round_s"] == 360
    assert rounds["cycles"] < base["cycles"]
    assert flat["overhead"] == "flat:30" and flat["avg_jct_s"] > base["avg_jct_s"]  # type: ignore[operator]


def test_compare_prints_one_table_and_writes_each_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["compare", "--trace", TRACE, "--cluster", CLUSTER, "--policies",
               "fifo,srtf,tiresias", "--out", str(tmp_path), "--processes", "2"])
    assert rc == 0
    table = capsys.readouterr().out
    for p in ("fifo", "srtf", "tiresias"):
        assert p in table and (tmp_path / p / "summary.json").exists()
    combined = json.loads((tmp_path / "compare.json").read_text())
    assert [s["policy"] for s in combined] == ["fifo", "srtf", "tiresias"]
    png = (tmp_path / "jct_cdf.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000  # a real plot, not an empty file


def test_sim_reads_a_trace_file_path(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    jobs = [make_job(f"j{i}").gpus(1 + i % 2).runs_for(100 + i).submit(i * 10).build()
            for i in range(5)]
    with trace.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration",
                    "interval"])
        for j in jobs:
            w.writerow([j.job_id, j.gpus, j.submit_time_s, j.iterations, j.model,
                        j.iterations * j.iteration_time_s, 0])
    out = tmp_path / "out"
    assert main(["sim", "--trace", str(trace), "--cluster", "n1g4", "--policy", "fifo",
                 "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["finished"] == 5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim", "--trace", "muri/nope", "--cluster", "n8g8", "--policy", "srtf"],
         "muri/nope: no bundled trace"),
        (["sim", "--trace", TRACE, "--cluster", "n99g99", "--policy", "srtf"], "n99g99"),
        # user text is printed as given: no emoji codes (":x:"), no markup ("[bold]")
        (["sim", "--trace", TRACE, "--cluster", "36:x:36", "--policy", "srtf"], "36:x:36"),
        (["sim", "--trace", "[bold]x.csv", "--cluster", CLUSTER, "--policy", "srtf"],
         "[bold]x.csv"),
        (["sim", "--trace", TRACE, "--cluster", CLUSTER, "--policy", "nope"],
         "unknown policy 'nope'; registered: allox, "),
        (["compare", "--trace", TRACE, "--cluster", CLUSTER, "--policies", "srtf,srtf"],
         "lists a policy twice"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("bad", [["--overhead", "zero"], ["--round-s", "-5"],
                                 ["--bus", "carrier-pigeon"]])
def test_bad_options_are_refused_by_the_parser(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--trace", TRACE, "--cluster", CLUSTER, "--policy", "srtf", *bad])
    assert exc.value.code == 2


def test_bad_trace_row_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "broken.csv"
    trace.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                     "1,2,0,100,vgg16,100,0\n2,two,10,100,vgg16,100,0\n")
    assert main(["sim", "--trace", str(trace), "--cluster", "n1g4", "--policy", "srtf"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "broken.csv line 3" in err and "num_gpu" in err


def test_listings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in ("fifo", "srtf", "srsf", "las", "tiresias"))
    assert main(["traces"]) == 0
    out = capsys.readouterr().out
    assert "muri/trace1" in out and "n8g8" in out


@pytest.mark.parametrize(("summary", "headers"), [
    ({"policy": "srtf", "deadline_jobs": 0, "declined": 0}, set()),
    ({"policy": "edf", "deadline_jobs": 5, "deadline_met": 2, "declined": 0}, {"met"}),
    ({"policy": "edf-accessctrl", "deadline_jobs": 5, "deadline_met": 2, "accepted": 2,
      "declined": 3}, {"met", "accepted", "declined"}),
])
def test_results_table_shows_deadline_counts_only_when_they_mean_something(
        summary: dict[str, object], headers: set[str]) -> None:
    from loom.report import results_table

    shown = {str(c.header) for c in results_table([summary], "t").columns}
    assert shown & {"met", "accepted", "declined"} == headers
