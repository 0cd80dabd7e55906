"""The tenant admission step as a pure function: quotas, fair share, the tenants file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import pytest

from domain.placement import CyclePlacement
from policies.base import JobView, Snapshot
from policies.mechanisms.admission import TenantGate, submit_refusal
from schemas.job import JobSpec
from schemas.status import StatusCode
from schemas.tenants import (
    TenantLimits,
    TenantsConfig,
    TenantsFileError,
    load_tenants,
    weighted_shares,
)
from tests.builders import cluster, make_job


def job(jid: str, tenant: str, gpus: int = 1) -> JobSpec:
    return make_job(jid).tenant(tenant).gpus(gpus).build()


def tenants(**limits: dict[str, float]) -> TenantsConfig:
    return TenantsConfig(tenants={t: TenantLimits(**v) for t, v in limits.items()})


@dataclass
class Cycle:
    """One cycle's walk: running jobs (with their GPUs) and waiting ones, in walk order."""

    config: TenantsConfig
    running: list[JobSpec] = field(default_factory=list)
    waiting: list[JobSpec] = field(default_factory=list)
    gpus: int = 8

    def walk(self) -> tuple[list[str], TenantGate]:
        views = {s.job_id: JobView.make(s, True, 0.0, 0.0) for s in self.running}
        views |= {s.job_id: JobView.make(s, False, 0.0, 0.0) for s in self.waiting}
        cl = cluster(nodes=self.gpus // 4 if self.gpus >= 4 else 1,
                     gpus_per_node=min(4, self.gpus))
        snap = Snapshot(0.0, cl, MappingProxyType(views),
                        tuple(views[s.job_id] for s in self.running))
        gate = TenantGate(CyclePlacement(cl, "count"), snap, self.config)
        placed = [s.job_id for s in self.running + self.waiting
                  if gate.try_place(s.job_id, s.gpus) is not None]
        return placed, gate


def ones(tenant: str, n: int, start: int = 0) -> list[JobSpec]:
    return [job(f"{tenant}{i}", tenant) for i in range(start, start + n)]


# (name, cycle, jobs placed, {held job: status code})
CASES = [
    ("tenants not in the file weigh 1: contended GPUs split evenly",
     Cycle(tenants(), waiting=ones("a", 6) + ones("b", 6)),
     ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"],
     {"a4": StatusCode.WAITING_FOR_FAIR_SHARE, "a5": StatusCode.WAITING_FOR_FAIR_SHARE}),
    ("GPU quota holds a tenant's extra jobs, others go on",
     Cycle(tenants(a={"max_gpus": 3}), waiting=ones("a", 5) + ones("b", 2)),
     ["a0", "a1", "a2", "b0", "b1"],
     {"a3": StatusCode.WAITING_FOR_TENANT_QUOTA, "a4": StatusCode.WAITING_FOR_TENANT_QUOTA}),
    ("GPU quota counts running jobs and whole gangs",
     Cycle(tenants(a={"max_gpus": 4}), running=[job("r", "a", 2)],
           waiting=[job("big", "a", 4), job("small", "a", 2)]),
     ["r", "small"], {"big": StatusCode.WAITING_FOR_TENANT_QUOTA}),
    ("weights 3:1 split contended GPUs 6:2 whatever the walk order",
     Cycle(tenants(a={"weight": 3}), waiting=ones("a", 8) + ones("b", 8)),
     [f"a{i}" for i in range(6)] + ["b0", "b1"],
     {"a6": StatusCode.WAITING_FOR_FAIR_SHARE, "a7": StatusCode.WAITING_FOR_FAIR_SHARE}),
    ("the light tenant first in the walk still gets only its share",
     Cycle(tenants(a={"weight": 3}), waiting=ones("b", 8) + ones("a", 8)),
     ["b0", "b1"] + [f"a{i}" for i in range(6)],
     {f"b{i}": StatusCode.WAITING_FOR_FAIR_SHARE for i in range(2, 8)}),
    ("what a tenant does not ask for goes to the others",
     Cycle(tenants(a={"weight": 1}, b={"weight": 7}), waiting=ones("a", 8) + ones("b", 1)),
     [f"a{i}" for i in range(7)] + ["b0"], {"a7": StatusCode.WAITING_FOR_FAIR_SHARE}),
    ("GPUs stay free for a tenant below its share whose job is wider than its share",
     Cycle(tenants(a={"weight": 3}), waiting=[*ones("a", 8), job("wide", "b", 4)]),
     [f"a{i}" for i in range(6)],
     {"a6": StatusCode.WAITING_FOR_FAIR_SHARE, "a7": StatusCode.WAITING_FOR_FAIR_SHARE}),
    ("a tenant below its share starts a whole gang, even past its share",
     Cycle(tenants(a={"weight": 3}), waiting=[job("wide", "b", 4), *ones("a", 8)]),
     ["wide", "a0", "a1", "a2", "a3"], {}),
    ("a running job above its tenant's share keeps its GPUs",
     Cycle(tenants(), running=[job("r", "a", 8)], waiting=ones("b", 2)),
     ["r"], {}),
    ("a tenant above its share may not start more while another waits",
     Cycle(tenants(), running=[job("r", "a", 6)], waiting=ones("a", 2, 1) + ones("b", 2)),
     ["r", "b0", "b1"],
     {"a1": StatusCode.WAITING_FOR_FAIR_SHARE, "a2": StatusCode.WAITING_FOR_FAIR_SHARE}),
    ("on an idle cluster fair share holds nothing back",
     Cycle(tenants(a={"weight": 3}), waiting=[job("wide", "b", 4), *ones("a", 6)]),
     ["wide", "a0", "a1", "a2", "a3"], {}),
    ("a tenant's first job is held like any other once GPUs are busy",
     Cycle(tenants(a={"weight": 3}), running=[job("r", "a", 4)],
           waiting=[job("wide", "b", 4), *ones("a", 2)]),
     ["r", "a0", "a1"], {"wide": StatusCode.WAITING_FOR_FAIR_SHARE}),
    ("a quota of 0 holds every job of the tenant",
     Cycle(tenants(a={"max_gpus": 0}), waiting=ones("a", 2)),
     [], {"a0": StatusCode.WAITING_FOR_TENANT_QUOTA, "a1": StatusCode.WAITING_FOR_TENANT_QUOTA}),
]


@pytest.mark.parametrize(("cycle", "placed", "held"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_gate(cycle: Cycle, placed: list[str], held: dict[str, StatusCode]) -> None:
    got, gate = cycle.walk()
    assert sorted(got) == sorted(placed)
    assert {j: s.code for j, s in gate.held.items()} == held
    for status in gate.held.values():
        assert status.decided_by == "tenancy" and "tenant" in status.reason


def test_hold_reason_names_tenant_and_numbers() -> None:
    _, gate = Cycle(tenants(a={"max_gpus": 3}), waiting=ones("a", 4)).walk()
    assert gate.held["a3"].reason == "tenant 'a' holds 3 of its 3 GPUs (max_gpus); " \
                                     "the job needs 1 more"
    assert gate.explain(1) == gate.held["a3"].reason  # what greedy_fill records as blocked
    _, gate = Cycle(tenants(a={"weight": 3}), waiting=ones("a", 8) + ones("b", 8)).walk()
    assert gate.held["a6"].reason == ("tenant 'a' would hold 7 GPUs, above its fair share of "
                                      "6.0, while 'b' below theirs wait")


def test_elastic_growth_is_gated_but_keeping_is_not() -> None:
    spec = make_job("e").tenant("a").scaling({1: 1.0, 2: 1.8, 4: 3.0}).gpus(2).build()
    views = {"e": JobView.make(spec, True, 0.0, 0.0, allocated=2)}
    cl = cluster(nodes=1, gpus_per_node=4)
    snap = Snapshot(0.0, cl, MappingProxyType(views), (views["e"],))
    gate = TenantGate(CyclePlacement(cl, "count"), snap, tenants(a={"max_gpus": 2}))
    assert gate.try_place("e", 4) is None
    assert gate.held["e"].code is StatusCode.WAITING_FOR_TENANT_QUOTA
    assert gate.try_place("e", 2) is not None and "e" not in gate.held
    assert gate.used["a"] == 2


def test_gate_is_never_monotone() -> None:
    _, gate = Cycle(tenants()).walk()
    assert gate.monotone is False  # a refusal depends on the tenant, not only the gang size


@pytest.mark.parametrize(("capacity", "demand", "weights", "shares"), [
    (8, {"a": 8, "b": 8}, {"a": 1, "b": 1}, {"a": 4, "b": 4}),
    (8, {"a": 8, "b": 8}, {"a": 3, "b": 1}, {"a": 6, "b": 2}),
    (8, {"a": 8, "b": 1}, {"a": 1, "b": 7}, {"a": 7, "b": 1}),
    (12, {"a": 2, "b": 20, "c": 20}, {"a": 1, "b": 1, "c": 2}, {"a": 2, "b": 10 / 3, "c": 20 / 3}),
    (8, {"a": 3, "b": 2}, {"a": 1, "b": 1}, {"a": 3, "b": 2}),
    (8, {"a": 0, "b": 9}, {"a": 1, "b": 1}, {"a": 0, "b": 8}),
])
def test_weighted_shares(capacity: int, demand: dict[str, float], weights: dict[str, float],
                         shares: dict[str, float]) -> None:
    assert weighted_shares(capacity, demand, weights) == pytest.approx(shares)


@pytest.mark.parametrize(("limit", "waiting", "refused"), [
    (None, 10_000, False), (3, 2, False), (3, 3, True), (0, 0, True)])
def test_submit_refusal(limit: int | None, waiting: int, refused: bool) -> None:
    config = tenants(a={"max_queued": limit}) if limit is not None else tenants()
    why = submit_refusal(config, job("x", "a"), waiting)
    assert (why is not None) == refused
    if why is not None:
        assert why == f"tenant 'a' already has {waiting} waiting jobs, its limit " \
                      f"(max_queued = {limit})"
    assert submit_refusal(config, job("y", "other"), waiting) is None  # unlisted: no limits


@pytest.mark.parametrize(("spec", "refused"), [
    (job("fits", "a", 4), False),
    (job("wide", "a", 8), True),
    (make_job("elastic").tenant("a").scaling({2: 1.0, 8: 3.0}).gpus(8).build(), True),
    (make_job("elastic").tenant("a").scaling({2: 1.0, 8: 3.0}).gpus(2).build(), False),
    (job("other", "b", 8), False),
])
def test_a_job_wider_than_its_tenants_gpu_quota_is_rejected(spec: JobSpec, refused: bool) -> None:
    why = submit_refusal(tenants(a={"max_gpus": 4}), spec, 0)
    assert (why is not None) == refused
    if why is not None:
        assert why == "asks for 8 GPUs; tenant 'a' may hold at most 4 (max_gpus)"


def test_load_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text('[tenants.nlp]\nweight = 2\nmax_gpus = 16\n[tenants.vision]\nmax_queued = 5\n')
    as_json = tmp_path / "t.json"
    as_json.write_text(json.dumps({"tenants": {"nlp": {"weight": 2, "max_gpus": 16},
                                               "vision": {"max_queued": 5}}}))
    for path in (toml, as_json):
        cfg = load_tenants(path)
        assert cfg.limits("nlp") == TenantLimits(weight=2, max_gpus=16)
        assert cfg.limits("vision").max_queued == 5
        assert cfg.limits("nobody") == TenantLimits()


@pytest.mark.parametrize(("name", "text", "message"), [
    ("t.toml", "[tenants.nlp]\nweight = -1\n",
     "t.toml: tenant 'nlp': weight: got -1; allowed: a number greater than 0"),
    ("t.toml", "[tenants.nlp]\nmax_gpus = 'x'\n",
     "t.toml: tenant 'nlp': max_gpus: got \"x\"; allowed: a whole number"),
    ("t.toml", "[tenants.nlp]\nmax_gpu = 3\n",
     "t.toml: tenant 'nlp': max_gpu: not a field Loom knows"),
    ("t.toml", '[tenants."bad name"]\n', "t.toml: tenant name 'bad name'"),
    ("t.toml", "[tenant.nlp]\n",
     "t.toml: tenant: not a field Loom knows; known fields: cohorts, queues, tenants"),
    ("t.toml", "[tenants\n", "t.toml: not valid TOML"),
    ("t.json", "[1, 2]", "t.json: expected a table of tenants, got list"),
    ("t.json", "{", "t.json: not valid JSON"),
])
def test_bad_file_names_file_tenant_and_field(tmp_path: Path, name: str, text: str,
                                              message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TenantsFileError) as err:
        load_tenants(path)
    assert str(err.value).startswith(str(tmp_path / message.split(":", 1)[0]))
    assert message.split(": ", 1)[1] in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TenantsFileError, match=r"nope\.toml: cannot read tenants file"):
        load_tenants(tmp_path / "nope.toml")
