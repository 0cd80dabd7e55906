"""Queues and cohorts in the tenants file: what a file means, and the errors that name the file,
the queue (or cohort) and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.queues import ANY_TYPE, DEFAULT_HALF_LIFE_S
from schemas.tenants import TenantLimits, TenantsConfig, TenantsFileError, load_tenants

TOML = """\
[tenants.nlp]
weight = 2
max_gpus = 16

[cohorts.research]
half_life_s = 3600

[queues.language]
cohort = "research"
tenants = ["nlp", "speech"]
nominal = 8
borrowing_limit = 4
lending_limit = 6
weight = 2
priority = 1
min_runtime_s = 600
reclaim = "lower_priority"

[queues.vision]
cohort = "research"
tenants = ["cv"]
nominal = 8

[queues.batch]
nominal = { v100 = 4, k80 = 8 }
"""


def test_a_file_with_queues(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(TOML)
    cfg = load_tenants(path)
    assert cfg.limits("nlp") == TenantLimits(weight=2, max_gpus=16)
    assert cfg.cohorts["research"].half_life_s == 3600
    lang = cfg.queues["language"]
    assert (lang.cohort, lang.tenants, lang.priority, lang.reclaim) == (
        "research", ("nlp", "speech"), 1, "lower_priority")
    assert lang.resources() == (ANY_TYPE,) and not lang.typed
    assert (lang.nominal_of(ANY_TYPE), lang.borrowing_of(ANY_TYPE),
            lang.lendable_of(ANY_TYPE)) == (8, 4, 6)
    vision = cfg.queues["vision"]
    assert (vision.borrowing_of(ANY_TYPE), vision.lendable_of(ANY_TYPE)) == (None, 8)
    assert (vision.weight, vision.priority, vision.min_runtime_s, vision.reclaim) == (
        1.0, 0, 0.0, "any")  # the defaults
    batch = cfg.queues["batch"]
    assert batch.typed and batch.resources() == ("v100", "k80")  # the file's order
    assert batch.cohort is None and batch.nominal_of("k80") == 8 and batch.nominal_of("a100") == 0
    assert [cfg.queue_of(t) for t in ("nlp", "speech", "cv", "other")] == [
        "language", "language", "vision", None]


def test_the_same_file_as_json(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({
        "cohorts": {"research": {}},
        "queues": {"a": {"cohort": "research", "tenants": ["x"], "nominal": {"v100": 2}}}}))
    cfg = load_tenants(path)
    assert cfg.cohorts["research"].half_life_s == DEFAULT_HALF_LIFE_S
    assert cfg.queues["a"].nominal == {"v100": 2}


def test_a_tenants_only_file_means_what_it_always_did(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[tenants.nlp]\nweight = 2\nmax_gpus = 16\n")
    cfg = load_tenants(path)
    assert cfg == TenantsConfig(tenants={"nlp": TenantLimits(weight=2, max_gpus=16)})
    assert cfg.queues == {} and cfg.cohorts == {} and cfg.queue_of("nlp") is None


Q = "[cohorts.c]\n[queues.a]\ncohort = 'c'\n"

# (name, file text, the message after "t.toml: ")
BAD = [
    ("negative nominal", Q + "nominal = -1\n",
     "queue 'a': nominal: got -1; allowed: a whole number of GPUs from 0, or a table of GPU "
     "type = GPUs"),
    ("a nominal that is text", Q + "nominal = 'x'\n",
     "queue 'a': nominal: got \"x\"; allowed: a whole number of GPUs from 0, or a table of GPU "
     "type = GPUs"),
    ("a negative quota of one type", Q + "nominal = { v100 = -2 }\n",
     "queue 'a': nominal.v100: got -2; allowed: a number of at least 0"),
    ("a negative borrowing limit", Q + "borrowing_limit = -1\n",
     "queue 'a': borrowing_limit: got -1; allowed: a whole number of GPUs from 0"),
    ("a negative lending limit", Q + "lending_limit = -3\n",
     "queue 'a': lending_limit: got -3; allowed: a whole number of GPUs from 0"),
    ("an unknown field", Q + "nominl = 3\n",
     "queue 'a': nominl: not a field Loom knows; known fields: borrowing_limit, cohort, "
     "lending_limit, min_runtime_s, nominal, priority, reclaim, tenants, weight"),
    ("an unknown reclaim rule", Q + "reclaim = 'sometimes'\n",
     "queue 'a': reclaim: got \"sometimes\"; allowed: one of 'never', 'lower_priority' or 'any'"),
    ("a zero weight", Q + "weight = 0\n", "queue 'a': weight: got 0; allowed: a number greater"),
    ("a bad queue name", "[queues.'a b']\n", "queue name 'a b': got \"a b\""),
    ("an unknown cohort", "[queues.a]\ncohort = 'research'\n",
     "queue 'a': cohort: 'research' is not a cohort of the file ([cohorts.*]: none)"),
    ("a tenant in two queues",
     Q + "tenants = ['t']\n[queues.b]\ncohort = 'c'\ntenants = ['u', 't']\n",
     "queue 'b': tenants: 't' is already in queue 'a'; a tenant belongs to one queue"),
    ("borrowing without a cohort", "[queues.a]\nnominal = 2\nborrowing_limit = 1\n",
     "queue 'a': borrowing_limit: a queue in no cohort neither borrows nor lends"),
    ("lending more than the nominal quota", Q + "nominal = 4\nlending_limit = 5\n",
     "queue 'a': lending_limit: 5 is more than its nominal quota (4)"),
    ("a limit per type over a total quota", Q + "nominal = 4\nborrowing_limit = { v100 = 1 }\n",
     "queue 'a': borrowing_limit: GPUs per type (a table), but its nominal quota is GPUs of any "
     "type (a number); use the same form"),
    ("a limit for a type without quota", Q + "nominal = { v100 = 4 }\n"
                                             "lending_limit = { a100 = 1 }\n",
     "queue 'a': lending_limit: GPU type 'a100' has no nominal quota in this queue"),
    ("one cohort counting two ways", Q + "nominal = 4\n[queues.b]\ncohort = 'c'\n"
                                         "nominal = { v100 = 4 }\n",
     "queue 'b': nominal: GPUs per type (a table), but queue 'a' of cohort 'c' counts GPUs of "
     "any type (a number); one cohort's queues count GPUs the same way"),
    ("a zero half-life", "[cohorts.c]\nhalf_life_s = 0\n",
     "cohort 'c': half_life_s: got 0; allowed: a number greater than 0"),
    ("an unknown section", "[queue.a]\n",
     "queue: not a field Loom knows; known fields: cohorts, queues, tenants"),
]


@pytest.mark.parametrize(("text", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_files_name_the_file_the_queue_and_the_field(tmp_path: Path, text: str,
                                                         message: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(TenantsFileError) as err:
        load_tenants(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)
