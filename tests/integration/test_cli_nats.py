"""`loom sim --bus nats` as a real subprocess: private server, external server, same answers."""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from pathlib import Path

from services.runtime.natsserver import EmbeddedNats
from tests.integration.pipeline import probe

LOOM = Path(sys.executable).parent / "loom"
TRACE = ["--trace", "tiresias/60_job", "--cluster", "tiresias/cluster_spec",
         "--policy", "tiresias"]


async def _loom(out: Path, *extra: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(LOOM), "sim", *TRACE, *extra, "--out", str(out), cwd=out.parent,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, stdout.decode(), stderr.decode()


def _summary(out: Path) -> dict[str, object]:
    return json.loads((out / "summary.json").read_text())  # type: ignore[no-any-return]


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "jobs.csv").open(newline="") as f:
        return list(csv.DictReader(f))


async def test_loom_sim_on_nats_matches_memory(tmp_path: Path, nats_server: EmbeddedNats) -> None:
    assert LOOM.exists(), LOOM
    mem_out, own_out, ext_out = tmp_path / "mem", tmp_path / "own", tmp_path / "ext"
    # Independent processes: run them side by side.
    (mem_rc, _, mem_err), (own_rc, own_stdout, own_err), (ext_rc, _, ext_err) = (
        await asyncio.gather(
            _loom(mem_out, "--bus", "memory"),
            _loom(own_out, "--bus", "nats"),  # starts its own embedded server
            _loom(ext_out, "--bus", "nats", "--nats-url", nats_server.url),
        )
    )
    assert mem_rc == 0, mem_err
    assert own_rc == 0, own_err
    assert ext_rc == 0, ext_err
    assert "wrote" in own_stdout and "summary.json" in own_stdout

    mem, own, ext = _summary(mem_out), _summary(own_out), _summary(ext_out)
    assert mem["bus"] == "memory"
    for s in (own, ext):
        assert s["bus"] == "nats"
        assert s["jobs"] == s["finished"] == 60
        assert s["errors"] == 0 and s["unfinished"] == 0
        assert s["policy"] == "tiresias" and s["trace"] == "tiresias/60_job"
        assert s["decision_digest"] == mem["decision_digest"]
        assert s["events"] == mem["events"]
        assert s["avg_jct_s"] == mem["avg_jct_s"] and s["makespan_s"] == mem["makespan_s"]

    mem_rows = _rows(mem_out)
    assert len(mem_rows) == 60
    for out in (own_out, ext_out):
        rows = _rows(out)
        assert len(rows) == 60
        assert len({r["job_id"] for r in rows}) == 60
        assert all(r["state"] == "finished" and r["end_s"] != "" for r in rows)
        assert rows == mem_rows

    # The external run really went through the fixture's server: its own stream is there
    # (named after the run, with a random suffix so re-runs never collide).
    async with probe(nats_server.url) as nc:
        streams = [s for s in await nc.jetstream().streams_info()
                   if s.config.name.startswith("LOOMSIM_tiresias-0_")]
        assert len(streams) == 1
        assert streams[0].state.messages == ext["events"]
