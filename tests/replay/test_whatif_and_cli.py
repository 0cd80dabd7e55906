"""What-if replays, the `loom replay` / `--log` command line, and export from a live stream."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import nats
import pytest

from loom.cli import main
from loom.eventlog import read_log, write_log
from loom.replay.cores import fresh_cores
from loom.replay.engine import replay
from loom.replay.whatif import arrivals, comparison_rows, recorded_summary, what_if
from loom.runs import RunSpec
from loom.simulate import run_simulation
from schemas import subjects
from services.runtime.bus import MSG_ID
from services.runtime.nats_live import ensure_stream
from services.runtime.natsserver import EmbeddedNats
from tests.replay.forging import forge_first_transition

LOGS = Path(__file__).resolve().parents[2] / "traces" / "logs"
TIRESIAS_LOG = LOGS / "tiresias-60job.eventlog.gz"  # tiresias/60_job on muri/testbed/n1g8


def _direct(policy: str) -> dict[str, object]:
    spec = RunSpec(trace="tiresias/60_job", cluster="muri/testbed/n1g8", policy=policy)
    return asyncio.run(run_simulation(spec.config())).summary


def test_what_if_equals_simulating_the_trace_under_that_policy() -> None:
    log = read_log(TIRESIAS_LOG)
    assert len(arrivals(log)) == 60
    whatif = asyncio.run(what_if(log, "srtf")).summary
    direct = _direct("srtf")
    assert whatif["decision_digest"] == direct["decision_digest"]
    recorded = recorded_summary(log)
    keys = ("finished", "avg_jct_s", "p99_jct_s", "makespan_s", "preemptions", "gpu_util")
    assert {k: recorded[k] for k in keys} == {k: _direct("tiresias")[k] for k in keys}
    assert recorded["avg_jct_s"] != whatif["avg_jct_s"]  # the policies do differ here
    rows = {label: (a, b) for label, a, b in comparison_rows(recorded, whatif)}
    assert rows["finished"] == ("60", "60")
    assert "deadline ratio" not in rows  # no deadline jobs: the row is left out


@pytest.mark.parametrize(("log", "recorded", "jobs"), [
    (TIRESIAS_LOG, "tiresias", 60),
    (LOGS / "live-srtf-n2g2.eventlog.gz", "srtf", 14),  # arrivals in the live cluster's clock
])
def test_replay_cli_what_if_prints_the_table(
        capsys: pytest.CaptureFixture[str], log: Path, recorded: str, jobs: int) -> None:
    assert main(["replay", str(log), "--policy", "fifo"]) == 0
    text = capsys.readouterr().out
    assert f"the {jobs} arrivals" in text
    assert f"recorded ({recorded})" in text and "what-if (fifo)" in text
    for label in ("avg JCT (s)", "makespan (s)", "preemptions", "GPU utilisation"):
        assert label in text


def test_sim_log_then_replay_ok_and_altered_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_path = tmp_path / "run.eventlog.gz"
    assert main(["sim", "--trace", "tiresias/60_job", "--cluster", "muri/testbed/n1g8",
                 "--policy", "srsf", "--out", str(tmp_path / "out"), "--log",
                 str(log_path)]) == 0
    digest = json.loads((tmp_path / "out" / "summary.json").read_text())["decision_digest"]
    capsys.readouterr()
    assert main(["replay", str(log_path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("OK ") and f"decision_digest {digest}" in text

    forged, index = forge_first_transition(read_log(log_path))
    write_log(forged, tmp_path / "forged.eventlog.gz")
    assert main(["replay", str(tmp_path / "forged.eventlog.gz")]) == 1
    text = capsys.readouterr().out
    assert f"DIVERGED: scheduler decision 1 at record {index}" in text
    assert "job_id: 'forged' recorded" in text


def test_replay_cli_says_how_many_decisions_fall_after_a_live_logs_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = read_log(LOGS / "live-srtf-n2g2.eventlog.gz")
    last = max(i for i, r in enumerate(log.records) if r.subject.endswith(".command"))
    write_log(dataclasses.replace(log, records=log.records[:last]), tmp_path / "cut.eventlog")
    capsys.readouterr()
    assert main(["replay", str(tmp_path / "cut.eventlog")]) == 0
    text = " ".join(capsys.readouterr().out.split())  # as wrapped to the terminal
    assert text.startswith("OK ") and "; 1 placer decisions after the log's end" in text


def test_compare_writes_one_log_per_policy(tmp_path: Path) -> None:
    assert main(["compare", "--trace", "elasticflow/resnet_cifar", "--cluster",
                 "elasticflow/n1g2", "--policies", "elasticflow,edf", "--processes", "1",
                 "--out", str(tmp_path / "out"), "--log", str(tmp_path / "logs")]) == 0
    for policy in ("elasticflow", "edf"):
        log = read_log(tmp_path / "logs" / f"{policy}.eventlog.gz")
        assert log.run.policy == policy
        assert replay(log, fresh_cores(log)).ok


@pytest.mark.nats
async def test_export_from_a_live_stream_replays(nats_server: EmbeddedNats,
                                                 tmp_path: Path) -> None:
    """A run's messages stored in a real JetStream stream (plus a person's JSON submission)
    come back in order through `loom log export`, and replay structurally."""
    log = read_log(LOGS / "elasticflow-resnet-cifar.eventlog.gz")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_stream(js)
        for rec in log.records:
            await js.publish(rec.subject, rec.data, headers={MSG_ID: rec.msg_id or "x"})
        await js.publish(subjects.JOB_SUBMIT, b'{"model": "bert", "gpus": 64, '
                                              b'"iterations": 5, "iteration_time_s": 1}')
    finally:
        await nc.drain()
    out = tmp_path / "live.eventlog.gz"
    rc = await asyncio.to_thread(main, [
        "log", "export", "--out", str(out), "--url", nats_server.url, "--policy",
        "elasticflow", "--cluster", "elasticflow/n1g2", "--overhead", log.run.overhead])
    assert rc == 0
    live = read_log(out)
    assert live.source == "live" and live.run.policy == "elasticflow"
    assert live.versions is None  # the exporter cannot know what the scheduler ran
    assert [(r.subject, r.msg_id, r.data) for r in live.records[:-1]] == \
        [(r.subject, r.msg_id, r.data) for r in log.records]
    assert [r.seq for r in live.records] == list(range(1, len(log.records) + 2))
    raw = live.records[-1]
    assert raw.msg_id is None and raw.time == live.records[-2].time  # it has no envelope
    result = replay(live, fresh_cores(live))
    # The JSON job asks for more GPUs than the cluster has: the fresh scheduler rejects it.
    # The recorded run never saw it, so the stream ends before that decision: counted as
    # after the live log's end, while every recorded decision matched.
    assert result.ok and result.cut_off == {"scheduler": 1}
    assert result.decisions["scheduler"] > 0
    trimmed = dataclasses.replace(live, records=live.records[:-1])
    assert replay(trimmed, fresh_cores(trimmed)).ok


@pytest.mark.parametrize(("change", "why"), [
    ({"cluster": None}, "header has no cluster spec"),
    ({"policy": "no-such-policy"}, "record 0: header: unknown policy 'no-such-policy'"),
    ({"overhead": "sometimes"}, "record 0: header: "),
    ({"cluster": {"name": "x", "nodes": []}}, "record 0: header: invalid cluster spec"),
    ({"throughputs": "nowhere/profile.json"}, "throughput profile nowhere/profile.json not found"),
])
def test_replay_refuses_a_header_it_cannot_build_cores_from(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object],
        why: str) -> None:
    log = read_log(LOGS / "elasticflow-resnet-cifar.eventlog.gz")
    bad = dataclasses.replace(log, run=dataclasses.replace(log.run, **change))  # type: ignore[arg-type]
    write_log(bad, tmp_path / "bad.eventlog")
    assert main(["replay", str(tmp_path / "bad.eventlog")]) == 2
    assert why in capsys.readouterr().err


def test_undecodable_inputs_are_skipped_as_the_bus_skipped_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = read_log(LOGS / "elasticflow-resnet-cifar.eventlog.gz")
    junk = dataclasses.replace(log.records[0], index=1, data=b"\xc1 not msgpack")
    records = [junk, *(dataclasses.replace(r, index=r.index + 1, seq=r.seq + 1)
                       for r in log.records)]
    write_log(dataclasses.replace(log, records=records), tmp_path / "junk.eventlog")
    assert main(["replay", str(tmp_path / "junk.eventlog")]) == 0
    assert "1 undecodable inputs skipped" in capsys.readouterr().out
