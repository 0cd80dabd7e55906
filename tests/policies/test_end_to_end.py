"""Small scenarios through the real services on the memory bus (`simulate`), no overheads.

Every expected JCT (end − submit, seconds) is derived by hand in the comments; all jobs run one
iteration per second, so "runs_for(100)" is 100 s of work at its GPU count.
"""

from __future__ import annotations

import pytest

from schemas.cluster import ClusterSpec
from schemas.job import JobSpec, JobState
from tests.builders import cluster, make_job, simulate


def J(job_id: str, gpus: int, seconds: float, submit: float) -> JobSpec:
    return make_job(job_id).gpus(gpus).runs_for(seconds).submit(submit).build()


# a: 2 GPUs 300 s @0; b: 4 GPUs 100 s @50; c: 2 GPUs 100 s @60. One node of 4 GPUs.
THREE = [J("a", 2, 300, 0), J("b", 4, 100, 50), J("c", 2, 100, 60)]
# a, b: 4 GPUs 1000 s @0; c: 4 GPUs 100 s @900. One node of 4 GPUs.
MLFQ3 = [J("a", 4, 1000, 0), J("b", 4, 1000, 0), J("c", 4, 100, 900)]


@pytest.mark.parametrize(
    ("policy", "jobs", "cl", "jct", "preemptions"),
    [
        # t=10: a has 90 s left > b's 30 → b preempts a, runs 10–40 (JCT 30);
        # a resumes at 40 with 90 s → ends 130 (JCT 130).
        pytest.param("srtf", [J("a", 4, 100, 0), J("b", 4, 30, 10)], cluster(1, 4),
                     {"a": 130, "b": 30}, {"a": 1, "b": 0}, id="srtf-shorter-arrival-preempts"),
        # srsf: long = 1 × 500 = 500 GPU-s < wide = 8 × 100 = 800: long runs 0–500 on 1 GPU,
        # wide (8) cannot start beside it, runs 500–600.
        pytest.param("srsf", [J("long", 1, 500, 0), J("wide", 8, 100, 0)], cluster(1, 8),
                     {"long": 500, "wide": 600}, {"long": 0, "wide": 0},
                     id="srsf-1gpu-long-before-8gpu-short"),
        # srtf on the same jobs: wide (100 s) first 0–100, long 100–600.
        pytest.param("srtf", [J("long", 1, 500, 0), J("wide", 8, 100, 0)], cluster(1, 8),
                     {"long": 600, "wide": 100}, {"long": 0, "wide": 0},
                     id="srtf-same-jobs-shortest-time-first"),
        # fifo: a 0–300 (2 GPUs). b (4) cannot fit beside a; c (2) can: 60–160 (JCT 100).
        # b starts when a ends: 300–400 (JCT 350).
        pytest.param("fifo", THREE, cluster(1, 4), {"a": 300, "b": 350, "c": 100},
                     {"a": 0, "b": 0, "c": 0}, id="fifo-skips-a-job-that-does-not-fit"),
        # srsf: t=50: a = 2 × 250 = 500 > b = 4 × 100 = 400 → b runs, a preempted.
        # t=60: c = 2 × 100 = 200 < b = 4 × 90 = 360 < a = 500: c takes 2 GPUs, b (4) no longer
        # fits and is preempted, a takes the other 2. t=160: c done; a = 2 × 150 = 300 < b 360:
        # a continues to 310 (JCT 310), then b 310–400 (90 s left; JCT 350). c: JCT 100.
        pytest.param("srsf", THREE, cluster(1, 4), {"a": 310, "b": 350, "c": 100},
                     {"a": 1, "b": 1, "c": 0}, id="srsf-gpu-time-preemptions"),
        # srtf: t=50: b 100 < a 250 → b runs 50–150 (JCT 100), a preempted. t=60: c 100 > b 90
        # → c waits. t=150: c and a both fit (2 + 2): c 150–250 (JCT 190), a 150–400 (JCT 400).
        pytest.param("srtf", THREE, cluster(1, 4), {"a": 400, "b": 100, "c": 190},
                     {"a": 1, "b": 0, "c": 0}, id="srtf-same-jobs"),
        # 2 × 4 GPUs: a (3) → n0, b (3) → n1; c (2) finds 1 + 1 free.
        # fifo (consolidated): c waits for a's node, 100–150 (JCT 140).
        pytest.param("fifo", [J("a", 3, 100, 0), J("b", 3, 200, 0), J("c", 2, 50, 10)],
                     cluster(2, 4), {"a": 100, "b": 200, "c": 140}, {"a": 0, "b": 0, "c": 0},
                     id="fifo-consolidated-waits"),
        # tiresias (GPU counting): c runs at once on 1 + 1 GPUs, 10–60 (JCT 50).
        pytest.param("tiresias", [J("a", 3, 100, 0), J("b", 3, 200, 0), J("c", 2, 50, 10)],
                     cluster(2, 4), {"a": 100, "b": 200, "c": 50}, {"a": 0, "b": 0, "c": 0},
                     id="tiresias-counts-gpus"),
        # tiresias: a runs from 0; b (Q0, behind the running a) waits. At ceil(3250/4) = 813 s a
        # has 3252 GPU-s → Q1; b runs 813–1013 (JCT 913); a resumes with 187 s → 1200.
        pytest.param("tiresias", [J("a", 4, 1000, 0), J("b", 4, 200, 100)], cluster(1, 4),
                     {"a": 1200, "b": 913}, {"a": 1, "b": 0}, id="tiresias-demotion"),
        # las on the same jobs: a needs 3250 s (not GPU-s) to be demoted; it ends at 1000 first.
        pytest.param("las", [J("a", 4, 1000, 0), J("b", 4, 200, 100)], cluster(1, 4),
                     {"a": 1000, "b": 1100}, {"a": 0, "b": 0}, id="las-no-demotion"),
        # tiresias: a 0–813 → Q1 (back); b 813–1626 → Q1, behind a. c arrived at 900 (Q0)
        # behind the running b; it runs 1626–1726 (JCT 826). Q1: a (187 s left) 1726–1913,
        # then b (187 s left) 1913–2100.
        pytest.param("tiresias", MLFQ3, cluster(1, 4), {"a": 1913, "b": 2100, "c": 826},
                     {"a": 1, "b": 1, "c": 0}, id="tiresias-demoted-jobs-queue-in-order"),
        # las: nothing reaches 3250 s; FIFO within Q0: a 0–1000, b 1000–2000, c 2000–2100.
        pytest.param("las", MLFQ3, cluster(1, 4), {"a": 1000, "b": 2000, "c": 1200},
                     {"a": 0, "b": 0, "c": 0}, id="las-fifo-within-q0"),
    ],
)
def test_jct(policy: str, jobs: list[JobSpec], cl: ClusterSpec, jct: dict[str, float],
             preemptions: dict[str, int]) -> None:
    result = simulate(jobs, policy, cl)
    assert result.summary["errors"] == 0
    assert result.summary["unfinished"] == 0
    outcomes = {o.job_id: o for o in result.jobs}
    assert all(o.state is JobState.FINISHED for o in outcomes.values())
    assert {j: o.jct_s for j, o in outcomes.items()} == pytest.approx(jct)
    assert {j: o.preemptions for j, o in outcomes.items()} == preemptions
    assert result.summary["avg_jct_s"] == pytest.approx(sum(jct.values()) / len(jct))
