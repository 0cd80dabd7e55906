"""Loom against the Muri simulator's own results on Muri trace3 (n8g8, Muri's overhead model).

Reference values: Muri's `simulator/draw_fig9-10.py` (paper Figs. 9–10), which we reproduced
by running Muri's `run_sim.py` beside Loom (docs/validation.md). Tiresias follows the same
decisions event for event; SRTF/SRSF differ only in placement (Loom keeps running jobs on their
GPUs; Muri re-packs every job at every event), within the issue's ±10 % target.
"""

from __future__ import annotations

import pytest

from tests.builders import simulate
from traces import load_cluster, load_trace

MURI_TRACE3_AVG_JCT = {"srtf": 193081.796, "srsf": 185021.8802, "tiresias": 347213.2481}
TOLERANCE = {"srtf": 0.02, "srsf": 0.02, "tiresias": 1e-6}


@pytest.mark.parametrize("policy", sorted(MURI_TRACE3_AVG_JCT))
def test_avg_jct_matches_muri_on_trace3(policy: str) -> None:
    trace = load_trace("muri/trace3")
    result = simulate(list(trace.jobs), policy, load_cluster("n8g8"), overhead="muri")
    assert result.summary["finished"] == 992
    avg = result.summary["avg_jct_s"]
    assert avg == pytest.approx(MURI_TRACE3_AVG_JCT[policy], rel=TOLERANCE[policy])
