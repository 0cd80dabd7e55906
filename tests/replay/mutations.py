"""Damage to an event log's bytes: the property tests' and bench/eventlog_mutations.py's.

A mutation is `(kind, a, b, noise)`: `a` and `b` pick places (taken modulo the data's length
or record count, so any integers do), `noise` is the bytes written or inserted. Record-level
kinds cut the msgpack stream at its records' boundaries, so they reorder, repeat or drop
whole records (a file still well-formed record by record).
"""

from __future__ import annotations

import gzip
import itertools
import random

import msgpack

BYTE_KINDS = ("flip", "overwrite", "truncate", "insert")
RECORD_KINDS = ("duplicate", "swap", "delete")
KINDS = BYTE_KINDS + RECORD_KINDS

Mutation = tuple[str, int, int, bytes]


def spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each msgpack object of a well-formed raw log."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    ends = [0]
    for _ in unpacker:
        ends.append(unpacker.tell())
    return list(itertools.pairwise(ends))


def _bytes_level(data: bytes, kind: str, a: int, b: int, noise: bytes) -> bytes:
    if kind == "insert":
        pos = a % (len(data) + 1)
        return data[:pos] + noise + data[pos:]
    if not data:
        return data
    pos = a % len(data)
    if kind == "flip":
        out = bytearray(data)
        out[pos] ^= 1 << (b % 8)
        return bytes(out)
    if kind == "overwrite":
        return data[:pos] + noise[:len(data) - pos] + data[pos + len(noise):]
    if kind == "truncate":
        return data[:pos]
    raise ValueError(f"unknown mutation {kind!r}")


def _record_level(data: bytes, kind: str, a: int, b: int) -> bytes:
    parts = [data[s:e] for s, e in spans(data)]
    i, j = a % len(parts), b % len(parts)
    if kind == "duplicate":
        parts.insert(i, parts[i])
    elif kind == "swap":
        parts[i], parts[j] = parts[j], parts[i]
    elif kind == "delete":
        del parts[i]
    else:
        raise ValueError(f"unknown mutation {kind!r}")
    return b"".join(parts)


def mutate(data: bytes, mutation: Mutation) -> bytes:
    kind, a, b, noise = mutation
    if kind in RECORD_KINDS:
        return _record_level(data, kind, a, b)
    return _bytes_level(data, kind, a, b, noise)


def gzipped(data: bytes) -> bytes:
    """`data` gzipped as the writer does (zero timestamp): damage inside a valid gzip stream,
    which gzip's own CRC does not see."""
    return gzip.compress(data, mtime=0)


def random_mutation(rng: random.Random, kinds: tuple[str, ...] = KINDS) -> Mutation:
    noise = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return rng.choice(kinds), rng.randrange(1 << 32), rng.randrange(1 << 32), noise
