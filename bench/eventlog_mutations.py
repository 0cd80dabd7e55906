"""Damaged event logs through `loom replay`: exit codes of random mutations, and tracebacks.

    .venv/bin/python bench/eventlog_mutations.py [--mutations 1000] [--seed 0] [--subprocess 8]
    .venv/bin/python bench/eventlog_mutations.py --policy fifo   # the what-if replay instead

Records tiresias/60_job on muri/testbed/n1g8 under Tiresias (a version-2 log, raw and
gzipped), then replays --mutations random mutations of each (bit flips, byte overwrites,
truncations, insertions, duplicated, swapped and deleted records; tests/replay/mutations.py)
through `loom.cli.main` in-process, and --subprocess of them through the `loom` command.
Rows:

- v2 raw: the raw file, mutated;
- v2 gz: the gzipped file's bytes, mutated (record-level kinds: the content, recompressed);
- v2 gz inner: the content mutated, then gzipped, so gzip's own CRC holds;
- v1 raw: the bundled version-1 Tiresias log (no checksums), for comparison.

Exit 0 is split by whether the log read is the original one (the mutation changed nothing it
says) or not (damage that went unseen). A traceback is an exception escaping `main`, or
"Traceback" on a subprocess's stderr. Target for version 2: no exit 1, no traceback, no
unseen damage.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import gzip
import io
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.replay.mutations

from loom.cli import main as loom_main  # noqa: E402
from loom.eventlog import EventLog, EventLogError, read_log  # noqa: E402
from tests.replay.mutations import (  # noqa: E402
    BYTE_KINDS,
    KINDS,
    Mutation,
    gzipped,
    mutate,
    random_mutation,
)

V1_LOG = REPO / "traces" / "logs" / "tiresias-60job.eventlog.gz"
SIM = ["sim", "--trace", "tiresias/60_job", "--cluster", "muri/testbed/n1g8", "--policy",
       "tiresias", "--no-plot"]


@dataclasses.dataclass
class Row:
    name: str
    original: bytes  # the file as written
    content: bytes  # its uncompressed content
    damage: Callable[[bytes, bytes, Mutation], bytes]  # (file, content, mutation) -> file
    suffix: str
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    crashes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


def _damage_raw(file: bytes, content: bytes, m: Mutation) -> bytes:
    return mutate(file, m)


def _damage_gz(file: bytes, content: bytes, m: Mutation) -> bytes:
    return mutate(file, m) if m[0] in BYTE_KINDS else gzipped(mutate(content, m))


def _damage_inner(file: bytes, content: bytes, m: Mutation) -> bytes:
    return gzipped(mutate(content, m))


def _quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return loom_main(argv)


def _same(path: Path, original: EventLog) -> bool:
    try:
        log = read_log(path)
    except EventLogError:
        return False
    return dataclasses.replace(log, path=original.path) == original


def run_row(row: Row, work: Path, n: int, rng: random.Random, extra: list[str]) -> list[Path]:
    """Replay n mutations in-process; returns a few of the damaged files, kept for the
    subprocess check."""
    original = work / f"original{row.suffix}"
    original.write_bytes(row.original)
    log = read_log(original)
    kept: list[Path] = []
    for i in range(n):
        path = work / f"{row.name.replace(' ', '-')}-{i}{row.suffix}"
        path.write_bytes(row.damage(row.original, row.content, random_mutation(rng, KINDS)))
        try:
            rc = _quiet(["replay", str(path), *extra])
        except Exception as exc:  # a traceback: what this bench looks for
            row.counts["traceback"] += 1
            row.crashes[f"{type(exc).__name__}: {str(exc)[:100]}"] += 1
            continue
        if rc == 0:
            rc_name = "0 (same log)" if _same(path, log) else "0 (damage unseen)"
        else:
            rc_name = str(rc)
        row.counts[rc_name] += 1
        if len(kept) < 64:
            kept.append(path)
        else:
            path.unlink()
    return kept


def _loom() -> list[str]:
    script = Path(sys.executable).parent / "loom"
    return [str(script)] if script.exists() else [sys.executable, "-m", "loom.cli"]


def via_subprocess(paths: list[Path], extra: list[str]) -> tuple[int, int, int]:
    """(runs, exit codes equal to in-process, tracebacks) through the `loom` command."""
    same = tracebacks = 0
    for path in paths:
        proc = subprocess.run([*_loom(), "replay", str(path), *extra], capture_output=True,
                              text=True, cwd=REPO, check=False)
        try:
            in_process = _quiet(["replay", str(path), *extra])
        except Exception:
            in_process = -1
        same += proc.returncode == in_process
        tracebacks += "Traceback" in proc.stderr
    return len(paths), same, tracebacks


def record(work: Path) -> tuple[bytes, bytes]:
    for name in ("run.eventlog", "run.eventlog.gz"):
        rc = _quiet([*SIM, "--out", str(work / "sim"), "--log", str(work / name)])
        if rc != 0:
            raise SystemExit(f"loom sim failed ({rc})")
    return (work / "run.eventlog").read_bytes(), (work / "run.eventlog.gz").read_bytes()


COLUMNS = ("0 (same log)", "0 (damage unseen)", "1", "2", "traceback")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subprocess", type=int, default=8, help="per row")
    parser.add_argument("--policy", help="run `loom replay LOG --policy P` (what-if)")
    args = parser.parse_args()
    extra = [] if args.policy is None else ["--policy", args.policy]
    work = Path(tempfile.mkdtemp(prefix="loom-mutations-"))
    try:
        raw, gz = record(work)
        v1 = gzip.decompress(V1_LOG.read_bytes())
        rows = [Row("v2 raw", raw, raw, _damage_raw, ".eventlog"),
                Row("v2 gz", gz, raw, _damage_gz, ".eventlog.gz"),
                Row("v2 gz inner", gzipped(raw), raw, _damage_inner, ".eventlog.gz"),
                Row("v1 raw", v1, v1, _damage_raw, ".eventlog")]
        print(f"{args.mutations} mutations per row, seed {args.seed}; file sizes: "
              f"v2 raw {len(raw):,} B, v2 gz {len(gz):,} B, v1 raw {len(v1):,} B")
        print(f"{'row':<13}" + "".join(f"{c:>19}" for c in COLUMNS) + f"{'s':>7}")
        for row in rows:
            start = time.perf_counter()
            rng = random.Random(f"{args.seed}-{row.name}")
            kept = run_row(row, work, args.mutations, rng, extra)
            took = time.perf_counter() - start
            print(f"{row.name:<13}" + "".join(f"{row.counts[c]:>19}" for c in COLUMNS)
                  + f"{took:>7.1f}")
            for crash, k in row.crashes.most_common():
                print(f"    {k} x {crash}")
            if args.subprocess:
                chosen = random.Random(args.seed).sample(kept, min(args.subprocess, len(kept)))
                n, same, tb = via_subprocess(chosen, extra)
                print(f"    subprocess: {n} runs of `loom replay`, {same} with the in-process "
                      f"exit code, {tb} tracebacks")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
