"""What hostile input costs: decoder refusals per second, and a live scheduler's dead-letter rate.

    .venv/bin/python bench/hostile_input.py [--payloads 2000]

1. The decoders alone (schemas/codec.py), per family of hostile payload (the fuzz tests'
   strategies, tests/fuzz/payloads.py), against a valid submission: payloads/s.
2. A live scheduler (`loom serve scheduler`, in-process) on a private nats-server: hostile
   payloads published at once to the submit subject, timed until every one is stored as a
   dead letter: dead letters/s, each one a decode, a JetStream publish + ack and an ack of
   the original.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Callable

import nats

from loom.serve import ServeOptions, ping, serve
from schemas import subjects
from schemas.cluster import ClusterSpec
from schemas.codec import CodecError, decode_submission
from services.runtime.logging import configure
from services.runtime.natsserver import EmbeddedNats
from tests.fuzz.payloads import (
    GOOD_JOB,
    bad_json,
    deep,
    draw_many,
    hostile,
    mutated,
    truncated,
    wrong_type,
)


def refusals_per_s(payloads: list[bytes]) -> float:
    start = time.perf_counter()
    for p in payloads:
        with contextlib.suppress(CodecError):
            decode_submission(p, fallback_id="x", now=0.0, producer="bench")
    return len(payloads) / (time.perf_counter() - start)


def pure(n: int) -> None:
    s = subjects.JOB_SUBMIT
    families: dict[str, Callable[[], object]] = {
        "truncated msgpack": lambda: truncated(s), "field mutated": lambda: mutated(s),
        "wrong event type": lambda: wrong_type(s), "deep nesting": lambda: deep(s),
        "bad JSON": bad_json,
    }
    print(f"{'decoder, submit subject':<28}{'payloads/s':>12}")
    for name, strategy in families.items():
        payloads = draw_many(strategy(), n)  # type: ignore[arg-type]
        print(f"{name:<28}{refusals_per_s(payloads):>12,.0f}")
    valid = [json.dumps({**GOOD_JOB, "job_id": f"j{i}"}).encode() for i in range(n)]
    print(f"{'valid JSON job (accepted)':<28}{refusals_per_s(valid):>12,.0f}")


async def live(n: int) -> None:
    payloads = draw_many(hostile(subjects.JOB_SUBMIT), n)
    server = await EmbeddedNats.start()
    stop = asyncio.Event()
    run = asyncio.create_task(serve(ServeOptions("scheduler", server.url,
                                                 ClusterSpec.uniform(1, 2, 4)), stop))
    nc = await nats.connect(server.url)
    try:
        while not await ping(nc, 0.1):
            pass
        js = nc.jetstream()
        start = time.perf_counter()
        for p in payloads:
            await nc.publish(subjects.JOB_SUBMIT, p)
        await nc.flush()
        while True:
            info = await js.stream_info(subjects.DEADLETTER_STREAM,
                                        subjects_filter=subjects.deadletter("scheduler"))
            if sum((info.state.subjects or {}).values()) >= n:
                break
            await asyncio.sleep(0.01)
        took = time.perf_counter() - start
        print(f"live scheduler: {n} hostile submissions dead-lettered in {took:.2f} s "
              f"({n / took:,.0f}/s); PING after: {await ping(nc)}")
    finally:
        stop.set()
        await run
        await nc.close()
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payloads", type=int, default=2000)
    args = parser.parse_args()
    configure("error")
    pure(args.payloads)
    asyncio.run(live(args.payloads))


if __name__ == "__main__":
    main()
