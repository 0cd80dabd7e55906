from __future__ import annotations

import itertools

import pytest

from schemas.job import JobState
from services.scheduler.lifecycle import TRANSITIONS, IllegalTransition, check

STATES: list[JobState | None] = [None, *JobState]


@pytest.mark.parametrize(("frm", "to"), list(itertools.product(STATES, list(JobState))))
def test_only_table_transitions_are_legal(frm: JobState | None, to: JobState) -> None:
    if (frm, to) in TRANSITIONS:
        check(frm, to, "j")
    else:
        with pytest.raises(IllegalTransition, match=r"j: .* is not a legal transition"):
            check(frm, to, "j")


def test_terminal_states_have_no_way_out() -> None:
    for frm, _ in TRANSITIONS:
        assert frm is None or not frm.terminal
