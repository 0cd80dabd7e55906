"""Production traces from the command line: `loom sim` on them (with `--trace-filter` and
the line saying what was left out), `loom gen-tenants`, `loom traces`, and the read
benchmark on a tiny log."""

from __future__ import annotations

import csv
import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from loom import compare_traces, trace_cli
from loom.cli import main
from loom.replay.commands import LoggedRunSpec
from loom.runs import RunSpec
from schemas.tenants import load_tenants
from tests.traces.production_builders import write_acme, write_gpu_numbers, write_helios

ROOT = Path(__file__).resolve().parents[2]


def _log(tmp_path: Path) -> Path:
    # j<m> submitted at minute m, 1/2/4/8 GPUs in turn, VC a or b; plus a CPU job and one
    # cancelled in the queue.
    rows = [{"submit_time": f"2020-04-01 00:{m:02d}:00", "start_time": f"2020-04-01 00:{m:02d}:00",
             "duration": str(100 + 10 * m), "gpu_num": str((1, 2, 4, 8)[m % 4]),
             "vc": "ab"[m % 2]} for m in range(12)]
    rows += [{"gpu_num": "0"}, {"start_time": "", "end_time": "", "duration": ""}]
    return write_helios(tmp_path, rows)


def test_sim_on_a_production_trace_with_a_filter(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["sim", "--trace", str(_log(tmp_path)), "--cluster", "helios/earth",
                 "--policy", "fifo", "--trace-filter", "gpus>=2 vc=b", "--out", str(out),
                 "--no-plot"])
    assert code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("trace cluster_log (helios): 6 jobs; 2 records left out (never started 1, no GPUs "
            "1); 6 outside --trace-filter 'gpus>=2 vc=b'") in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"] == summary["finished"] == 6
    assert summary["trace_format"] == "helios" and summary["trace_filter"] == "gpus>=2 vc=b"
    assert summary["trace_skipped"] == {"never started": 1, "no GPUs": 1}
    assert summary["trace_filtered_out"] == 6
    assert any("duration-only" in a for a in summary["trace_assumptions"])
    assert set(summary["tenants"]) == {"b"}


def test_research_trace_runs_say_nothing_new(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["sim", "--trace", "tiresias/60_job", "--cluster", "n1g4", "--policy", "fifo",
                 "--out", str(out), "--no-plot"]) == 0
    assert "trace tiresias" not in capsys.readouterr().out
    assert "trace_assumptions" not in json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize(("expr", "fragment"), [
    ("gpus>=x", "trace filter 'gpus>=x': expected a whole number of GPUs >= 1, got 'x'"),
    ("colour=red", "unknown key 'colour'"),
    ("state=COMPLETED", "the tiresias format records no job states"),
])
def test_bad_filter_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str], expr: str,
                                            fragment: str) -> None:
    assert main(["sim", "--trace", "tiresias/60_job", "--cluster", "n1g4", "--policy", "fifo",
                 "--trace-filter", expr, "--no-plot"]) == 2
    assert fragment in " ".join(capsys.readouterr().err.split())


def test_traced_specs_keep_their_kind_and_cross_processes(tmp_path: Path) -> None:
    spec = RunSpec(trace="tiresias/60_job", cluster="n1g4", policy="fifo")
    plain = trace_cli.traced(spec, "gpus>=2")
    logged = trace_cli.traced(LoggedRunSpec(**dataclasses.asdict(spec), log=tmp_path / "l"),
                              None)
    assert isinstance(plain, trace_cli.TracedRunSpec)
    assert isinstance(logged, trace_cli.TracedLoggedRunSpec) and logged.log == tmp_path / "l"
    assert pickle.loads(pickle.dumps(plain)) == plain
    assert trace_cli.traced(plain, None) == trace_cli.traced(spec, None)
    jobs = plain.config().jobs
    assert jobs and all(j.gpus >= 2 for j in jobs)
    assert trace_cli.loaded(plain) is trace_cli.loaded(plain)  # read once per process


def test_sim_replays_recorded_failures_and_shows_failed_jobs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_acme(tmp_path, [{"state": "FAILED", "duration": "7200"},
                                  {"state": "COMPLETED", "duration": "3600"}])
    out, log = tmp_path / "run", tmp_path / "run.eventlog.gz"
    assert main(["sim", "--trace", str(trace), "--cluster", "acme/seren", "--policy", "fifo",
                 "--replay-failures", "--overhead", "none", "--out", str(out), "--log",
                 str(log), "--no-plot"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "trace trace_seren (acme): 2 jobs; 1 recorded failures to replay" in text
    assert ("2 jobs: 1 finished, 0 rejected, 0 unfinished, 1 failed; 1 recorded failures "
            "replayed") in text
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["finished"], summary["failed"], summary["failures_replayed"]) == (1, 1, 1)
    assert summary["trace_replay_failures"] is True
    assert summary["trace_assumptions"][-1].startswith("failures replayed")
    rows = {r["job_id"]: r for r in csv.DictReader((out / "jobs.csv").open())}
    assert rows["dlc0"]["state"] == "failed" and float(rows["dlc0"]["end_s"]) == 7200.0
    assert rows["dlc0"]["jct_s"] == "" and rows["dlc1"]["state"] == "finished"
    # The log replays to the same decisions: its scheduler took the job's marks in too.
    assert main(["replay", str(log), "--quiet"]) == 0


def test_without_the_flag_failed_jobs_finish(tmp_path: Path) -> None:
    trace = write_acme(tmp_path, [{"state": "FAILED"}])
    out = tmp_path / "run"
    assert main(["sim", "--trace", str(trace), "--cluster", "acme/seren", "--policy", "fifo",
                 "--out", str(out), "--no-plot"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["finished"], summary["failed"], summary["failures_replayed"]) == (1, 0, 0)
    assert summary["trace_replay_failures"] is False
    assert summary["trace_assumptions"][-1].startswith("failures not replayed")


def test_replay_failures_of_a_research_trace_exits_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--trace", "tiresias/60_job", "--cluster", "n1g4", "--policy", "fifo",
                 "--replay-failures", "--no-plot"]) == 2
    assert "records no failures to replay; drop --replay-failures" in " ".join(
        capsys.readouterr().err.split())


def test_traced_specs_carry_the_replay_flag_across_processes(tmp_path: Path) -> None:
    trace = write_acme(tmp_path, [{"state": "FAILED"}])
    spec = trace_cli.traced(RunSpec(trace=str(trace), cluster="acme/seren", policy="fifo"),
                            None, replay_failures=True)
    assert pickle.loads(pickle.dumps(spec)) == spec
    (job,) = spec.config().jobs
    assert job.fail_at == (float(job.iterations),)
    (plain,) = trace_cli.traced(spec, None).config().jobs  # the flag is given, or it is off
    assert plain.fail_at is None


def test_compare_across_traces_replays_failures_in_every_entry(tmp_path: Path) -> None:
    acme, helios = tmp_path / "acme", tmp_path / "helios"
    acme.mkdir(), helios.mkdir()
    entries = compare_traces.parse_traces(
        f"{write_acme(acme, [{'state': 'FAILED'}])}@acme/seren,"
        f"{write_helios(helios, [{'state': 'FAILED'}])}@helios/venus", None)
    prepared = compare_traces.prepare(
        entries, ["fifo"], lambda name: RunSpec(trace="", cluster="", policy=name), None,
        None, replay_failures=True)
    for p in prepared:
        (job,) = p.specs[0].config().jobs
        assert job.fail_at == (float(job.iterations),)
        assert p.annotations["trace_replay_failures"] is True


def test_gen_tenants_from_helios_gpu_numbers(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    numbers = write_gpu_numbers(tmp_path, [("2020-09-27", {"a": "16", "b": "8", "c": "0"})],
                                vcs=["a", "b", "c"])
    dest = tmp_path / "tenants.toml"
    assert main(["gen-tenants", str(numbers), "--out", str(dest)]) == 0
    captured = capsys.readouterr()
    assert "wrote" in captured.out and "2 tenants" in captured.out
    assert "left out (no GPUs that day): c" in captured.err
    tenants = load_tenants(dest)
    assert {t: (v.weight, v.max_gpus) for t, v in tenants.tenants.items()} == {
        "a": (16.0, 16), "b": (8.0, 8)}
    assert dest.read_text().startswith("# Generated by loom gen-tenants from "
                                       "cluster_gpu_number.csv, 2020-09-27")
    # ... and a run uses it.
    assert main(["sim", "--trace", str(_log(tmp_path)), "--cluster", "helios/earth",
                 "--policy", "fifo", "--tenants", str(dest), "--out", str(tmp_path / "r"),
                 "--no-plot"]) == 0


def test_gen_tenants_prints_toml_from_a_trace(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gen-tenants", str(_log(tmp_path)), "--trace-filter", "vc=a"]) == 0
    assert capsys.readouterr().out == (
        "# Generated by loom gen-tenants from cluster_log.csv (helios): weight = % of the "
        "trace's GPU time, no quota\n\n[tenants.\"a\"]\nweight = 100.0\n")
    assert main(["gen-tenants", str(tmp_path / "missing.csv")]) == 2


def test_traces_lists_formats_and_clusters_with_sources(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["traces"]) == 0
    text = capsys.readouterr().out
    for fragment in ("philly-log", "helios", "acme", "alibaba-pai", "CC-BY-4.0",
                     "https://github.com/msr-fiddle/philly-traces", "docs/traces/helios.md",
                     "helios/saturn", "2,096", "acme/kalos", "2,416", "philly", "2,490"):
        assert fragment in text, fragment


def test_read_benchmark_runs_on_a_tiny_log() -> None:
    done = subprocess.run([sys.executable, "bench/trace_read.py", "--rows", "500", "--iterate",
                           "--json"], cwd=ROOT, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout)
    assert result["rows"] == 500 and result["meets_target"]
    assert result["jobs"] + sum(result["skipped"].values()) == 500
