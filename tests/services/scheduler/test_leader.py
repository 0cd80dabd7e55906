"""The election state machine (`Elector`): pure, so time and the KV's answers are inputs."""

from __future__ import annotations

import random

import pytest

from services.scheduler.leader import Elector, Lease, LeaseError, Observed, Outcome, Write

LEASE, RENEW, SKEW = 6.0, 2.0, 0.5


def elector(me: str = "a") -> Elector:
    return Elector(me, lease_s=LEASE, renew_s=RENEW, skew_s=SKEW)


def leader_at(now: float, me: str = "a", term: int = 1, rev: int = 1) -> Elector:
    e = elector(me)
    w = e.observe(None if term == 1 else Observed(Lease("x", term - 1, 0.0), rev - 1), now)
    assert w is not None
    e.written(w, rev, now)
    return e


def test_the_first_replica_creates_the_lease_with_term_one() -> None:
    e = elector()
    w = e.observe(None, 100.0)
    assert w == Write(Lease("a", 1, 106.0), None)
    assert not e.is_leader(100.0)  # not before the store said yes
    e.written(w, 7, 100.0)
    assert e.is_leader(100.0) and e.term == 1 and e.revision == 7
    assert e.is_leader(105.49) and not e.is_leader(105.5)  # sent_at + lease − skew


# (what the standby reads, when) → what it writes
STANDBY = {
    "fresh lease of another: wait": (Observed(Lease("b", 3, 110.0), 5), 109.0, None),
    "expired but within the skew: wait": (Observed(Lease("b", 3, 110.0), 5), 110.4, None),
    "lapsed: take it with the next term": (
        Observed(Lease("b", 3, 110.0), 5), 110.5, Write(Lease("a", 4, 116.5), 5)),
    "garbage in the key: overwrite above every term seen": (
        Observed(None, 9), 50.0, Write(Lease("a", 1, 56.0), 9)),
    "our own id from a previous life: new term at once": (
        Observed(Lease("a", 3, 200.0), 5), 100.0, Write(Lease("a", 4, 106.0), 5)),
}


@pytest.mark.parametrize("case", list(STANDBY))
def test_standby(case: str) -> None:
    seen, now, expected = STANDBY[case]
    assert elector().observe(seen, now) == expected


def test_the_leader_renews_its_own_revision_and_extends_its_deadline() -> None:
    e = leader_at(100.0)
    w = e.observe(Observed(Lease("a", 1, 106.0), 1), 102.0)
    assert w == Write(Lease("a", 1, 108.0), 1)
    e.written(w, 2, 102.0)
    assert e.is_leader(107.4) and e.term == 1


@pytest.mark.parametrize(("outcome", "leader_at_104", "leader_at_106"), [
    (2, True, True),  # renewed
    ("unreachable", True, False),  # no news: the old deadline stands
    ("conflict", False, False),  # someone else wrote: step down at once
])
def test_outcome_of_a_renewal(outcome: Outcome, leader_at_104: bool, leader_at_106: bool
                              ) -> None:
    e = leader_at(100.0)
    w = e.observe(Observed(Lease("a", 1, 106.0), 1), 102.0)
    assert w is not None
    e.written(w, outcome, 102.0)
    assert e.is_leader(104.0) is leader_at_104
    assert e.is_leader(106.0) is leader_at_106


def test_a_deposed_leader_steps_down_when_it_sees_another_holder() -> None:
    e = leader_at(100.0)
    assert e.observe(Observed(Lease("b", 2, 120.0), 4), 101.0) is None
    assert not e.is_leader(101.0)
    assert e.seen_term == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lease_s": 4.0, "renew_s": 2.0, "skew_s": 0.5}, "2·renew_s + skew_s < lease_s"),
    ({"lease_s": 6.0, "renew_s": 0.0, "skew_s": 0.5}, "renew_s=0.0"),
    ({"lease_s": 6.0, "renew_s": 1.0, "skew_s": -1.0}, "skew_s must not be negative"),
])
def test_bad_timing_is_refused_with_the_numbers(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        Elector("a", **kwargs)


@pytest.mark.parametrize("raw", [b"", b"{}", b'{"holder": "a", "term": "x", "expires_at": 1}',
                                 b'{"holder": "a", "term": -1, "expires_at": 1}', b"\xff"])
def test_an_undecodable_lease_says_what_is_wrong(raw: bytes) -> None:
    with pytest.raises(LeaseError, match="lease 'scheduler'"):
        Lease.decode(raw)


class CasKV:
    """A model of one KV key with compare-and-set, to drive electors against each other."""

    def __init__(self) -> None:
        self.value: Lease | None = None
        self.revision = 0

    def read(self) -> Observed | None:
        return None if self.value is None else Observed(self.value, self.revision)

    def write(self, w: Write) -> Outcome:
        if (self.value is None) != (w.revision is None) or (
                w.revision is not None and w.revision != self.revision):
            return "conflict"
        self.revision += 1
        self.value = w.lease
        return self.revision


@pytest.mark.parametrize("seed", range(40))
def test_never_two_leaders_and_terms_only_grow(seed: int) -> None:
    """Replicas step at jittered times, pause for random stretches (a GC, a SIGSTOP), lose
    writes or their answers: at no instant do two of them believe they lead."""
    rng = random.Random(seed)
    kv = CasKV()
    replicas = [elector(name) for name in "abc"]
    next_step = {e.me: rng.uniform(0, RENEW) for e in replicas}
    terms: list[int] = []
    t = 0.0
    while t < 300.0:
        me = min(next_step, key=next_step.__getitem__)
        t = next_step[me]
        e = next(r for r in replicas if r.me == me)
        w = e.observe(kv.read(), t)
        if w is not None:
            luck = rng.random()
            outcome = kv.write(w) if luck > 0.1 else "unreachable"
            if luck < 0.05:  # stored, but the answer was lost
                kv.write(w)
            e.written(w, outcome, t)
            if isinstance(outcome, int) and (not terms or terms[-1] != w.lease.term):
                terms.append(w.lease.term)
        pause = rng.expovariate(1 / 8) if rng.random() < 0.05 else 0.0
        next_step[me] = t + RENEW + rng.uniform(-0.2, 0.2) + pause
        for probe in (t, t + 0.01, t + 0.5):
            assert sum(r.is_leader(probe) for r in replicas) <= 1, (seed, probe)
    assert terms == sorted(set(terms)) and len(terms) >= 1
