"""Hostile payloads for the fuzz tests: hypothesis strategies of bytes a subject must refuse.

`hostile(subject)` draws from every family the wire layer has to survive: random bytes,
truncated msgpack, valid envelopes with a field swapped for a wrong type, an out-of-range or
non-finite number, a huge string or deep nesting, well-formed envelopes of an event type the
subject does not carry, and on the submit subject bad JSON and oversized submissions.
`refused(subject, payload)` is what a live consumer does before its core sees a message, so
a test can keep only payloads that must be dead-lettered (a mutation may happen to be valid).
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from domain import causes
from schemas import subjects
from schemas.codec import (
    MAX_DEPTH,
    MAX_SUBMISSION_BYTES,
    CodecError,
    check_subject,
    decode,
    decode_submission,
    encode,
)
from schemas.events import (
    CycleStarted,
    JobFinished,
    JobTransition,
    Launch,
    NodeCommand,
    NodeHeartbeat,
    NodeInfo,
    NodeStatus,
    OperatorCommand,
    PlanDecided,
    StartForecast,
    Stop,
    TrainerReport,
    envelope,
)
from schemas.job import JobState, SubmitJob
from schemas.queue_status import QueueState, QueueStatus, QuotaUsage, WaitCount
from schemas.status import StatusCode
from tests.builders import make_job

SPEC = make_job("fz-1").build()
SAMPLE_BODIES: dict[str, Any] = {
    subjects.JOB_SUBMIT: SubmitJob.from_spec(SPEC),
    subjects.JOB_TRANSITION: JobTransition(job_id="fz-1", state=JobState.QUEUED, previous=None,
                                           cause="admitted", reason=causes.ADMITTED, spec=SPEC),
    subjects.JOB_FINISHED: JobFinished(job_id="fz-1", node_id="n0", iterations_done=100.0),
    subjects.JOB_PROGRESS: TrainerReport(job_id="fz-1", node_id="n0", event="progress",
                                         iteration=3),
    subjects.CYCLE_STARTED: CycleStarted(cycle=1, trigger="fuzz"),
    subjects.PLAN_DECIDED: PlanDecided(cycle=1, launches=(
        Launch(job_id="fz-1", spec=SPEC, placement=(("n0", (0,)),)),),
        stops=(Stop(job_id="fz-0", reason="preempted"),)),
    subjects.START_FORECAST: StartForecast(at=1.0, cycle=1, starts={"fz-1": 60.0,
                                                                    "fz-2": None}),
    subjects.QUEUE_STATUS: QueueStatus(at=1.0, cycle=1, tenants_file=True, queues=(QueueState(
        name="qa", quotas=(QuotaUsage(gpu_type="*", nominal=4, used=2),), running_jobs=1,
        waiting=(WaitCount(code=StatusCode.WAITING_FOR_QUOTA_IN_COHORT, jobs=1, job_id="fz-1",
                           reason="fuzz"),)),)),
    subjects.OPERATOR: OperatorCommand(command="cancel", job_id="fz-1"),
    subjects.NODE_STATUS: NodeStatus(node_id="n0", cycle=1, progress={"fz-1": 5.0}),
    subjects.NODE_INFO: NodeInfo(node_id="n0", backend="fake", gpus=()),
    subjects.NODE_HEARTBEAT: NodeHeartbeat(node_id="n0"),
    subjects.node_command("n0"): NodeCommand(node_id="n0", cycle=1),
}


def sample_dict(subject: str) -> dict[str, Any]:
    """A valid envelope for `subject`, as the dict msgpack carries."""
    env = envelope(SAMPLE_BODIES[subject], event_id="fz-e1", occurred_at=1.0, producer="fuzz",
                   causation_id=None)
    return msgpack.unpackb(encode(env), raw=False, strict_map_key=False)  # type: ignore[no-any-return]


def pack(data: Any) -> bytes:
    return msgpack.packb(data, use_bin_type=True)  # type: ignore[no-any-return]


def decoder_for(subject: str) -> Any:
    if subject == subjects.JOB_SUBMIT:
        return lambda p: decode_submission(p, fallback_id="seq.1", now=0.0, producer="fuzz")
    return decode


def refused(subject: str, payload: bytes) -> bool:
    """True if a live consumer of `subject` dead-letters `payload` before its core sees it."""
    try:
        env = decoder_for(subject)(payload)
        check_subject(subject, env.type)
    except CodecError:
        return True
    return False


# -- values that break a field ----------------------------------------------------------------
def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_VALUES: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 2**63 - 1,
                     -(2**63), 2**64 - 1, -1, 0, None, True, "", b"\x00\xff", [], {}]),
    st.text(min_size=1, max_size=20),  # a string where a number goes, or a bad name
    st.text(alphabet="a", min_size=129, max_size=20_000),  # longer than any bounded string
    st.integers(min_value=MAX_DEPTH + 1, max_value=400).map(nested),
    st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**64 - 1), min_size=1,
                    max_size=4),
)


@st.composite
def mutated(draw: st.DrawFn, subject: str) -> bytes:
    """A valid envelope with one field (of the envelope or its body) replaced."""
    data = sample_dict(subject)
    target = draw(st.sampled_from(["envelope", "body", "body"]))
    where = data if target == "envelope" else data["body"]
    key = draw(st.sampled_from([*sorted(where), "unexpected_field"]))
    where[key] = draw(BAD_VALUES)
    return pack(data)


@st.composite
def wrong_type(draw: st.DrawFn, subject: str) -> bytes:
    """A well-formed envelope of an event type `subject` does not carry."""
    others = [s for s in SAMPLE_BODIES if SAMPLE_BODIES[s].__class__
              is not SAMPLE_BODIES[subject].__class__]
    return pack(sample_dict(draw(st.sampled_from(others))))


@st.composite
def truncated(draw: st.DrawFn, subject: str) -> bytes:
    whole = pack(sample_dict(subject))
    return whole[:draw(st.integers(min_value=0, max_value=len(whole) - 1))]


def deep(subject: str) -> st.SearchStrategy[bytes]:
    """Nesting far past MAX_DEPTH, as the whole payload or inside a valid envelope's body."""
    def inside(depth: int) -> bytes:
        data = sample_dict(subject)
        data["body"]["extra"] = nested(depth)
        return pack(data)
    depths = st.integers(min_value=MAX_DEPTH + 1, max_value=500)
    return st.one_of(depths.map(lambda d: pack(nested(d))), depths.map(inside))


GOOD_JOB = {"model": "resnet18", "gpus": 1, "iterations": 10, "iteration_time_s": 1.0}


def bad_json() -> st.SearchStrategy[bytes]:
    """What people (or attackers) type at the submit subject's JSON door."""
    job = json.dumps(GOOD_JOB).encode()
    over = {**GOOD_JOB, "job_type": "x" * MAX_SUBMISSION_BYTES}
    return st.one_of(
        st.integers(min_value=1, max_value=len(job) - 1).map(lambda n: job[:n]),  # truncated
        st.sampled_from([
            b'{"model": "m", "gpus": NaN, "iterations": 1, "iteration_time_s": 1}',
            b'{"model": "m", "gpus": 1, "iterations": Infinity, "iteration_time_s": 1}',
            b'{"model": "m", "gpus": 1, "iterations": 1, "iteration_time_s": -Infinity}',
            b'{"model": "m", "gpus": ' + b"9" * 5000 + b', "iterations": 1}',
            b'{"model": "\xff\xfe", "gpus": 1}',
            b'{"a":' + b"[" * 3000 + b"1" + b"]" * 3000 + b"}",
            json.dumps(over).encode(),  # over MAX_SUBMISSION_BYTES
            b"{}",
        ]),
        st.fixed_dictionaries({k: st.just(v) for k, v in GOOD_JOB.items()}).flatmap(
            lambda d: st.sampled_from(sorted(d)).flatmap(
                lambda k: BAD_VALUES.map(lambda v: json.dumps({**d, k: v}, default=repr)
                                         .encode()))),
    )


def edge_cases(subject: str) -> list[bytes]:
    """Payloads every run sends, whatever hypothesis draws: each family at its extreme."""
    def envelope_with(**change: Any) -> bytes:
        data = sample_dict(subject)
        data.update(change)
        return pack(data)
    big_body = sample_dict(subject)
    big_body["body"]["padding"] = "x" * 900_000  # under the 1 MiB limit: refused by schema
    cases = [b"", b"\xc1", pack([1, 2, 3]), envelope_with(occurred_at=float("nan")),
             envelope_with(occurred_at=float("inf")), envelope_with(event_id="e" * 10_000),
             envelope_with(type="loom.job.submit.v9"), pack(big_body),
             pack(nested(1000)), envelope_with(body=nested(50))]
    if subject == subjects.JOB_SUBMIT:
        oversized = sample_dict(subject)
        oversized["body"]["job_type"] = "x" * MAX_SUBMISSION_BYTES
        cases += [pack(oversized), json.dumps({**GOOD_JOB, "model": "m" * 70_000}).encode(),
                  b'{"model": "m", "gpus": NaN}', b'{"gpus": ' + b"9" * 5000 + b"}",
                  b'{"a":' + b"[" * 3000 + b"]" * 3000 + b"}", b'{"model": "\xff"}',
                  json.dumps({**GOOD_JOB, "gpus": 10**30}).encode(),
                  json.dumps({**GOOD_JOB, "iteration_time_s": 1e308}).encode()]
    return cases


def hostile(subject: str) -> st.SearchStrategy[bytes]:
    families = [st.binary(max_size=256), truncated(subject), mutated(subject),
                wrong_type(subject), deep(subject)]
    if subject == subjects.JOB_SUBMIT:
        families.append(bad_json())
    return st.one_of(*families).filter(lambda p: refused(subject, p))


def draw_many(strategy: st.SearchStrategy[bytes], n: int) -> list[bytes]:
    """`n` examples of `strategy`, the same on every run (derandomized, no database)."""
    out: list[bytes] = []

    @settings(max_examples=n, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), deadline=None)
    @given(strategy)
    def grab(payload: bytes) -> None:
        out.append(payload)

    grab()
    return out
